//! Error tests: failures reported on written vars, propagated through readers, cleared by a
//! later successful write, logged once for `wait_all`; panics and dropped completions.

use std::slice::from_ref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{op_of, watchdog, Gate};
use crate::engine::{Engine, Error, Var};

#[test]
fn failing_op_reports_on_its_write_var_once() {
    watchdog(|| {
        let engine = Engine::new(2);
        let (x, untouched) = (Var::new(), Var::new());
        engine.push("bad", from_ref(&untouched), from_ref(&x), 0, || Err("boom".into()));
        let err = engine.wait_to_read(&x).unwrap_err();
        assert!(matches!(err, Error::Failed { op: "bad", .. }), "{err}");
        assert!(err.to_string().contains("boom"), "{err}");
        assert!(engine.wait_to_read(&x).is_ok(), "the wait should have cleared the error");
        assert!(engine.wait_to_read(&untouched).is_ok(), "a read var must not record it");
        assert_eq!(op_of(&engine.wait_all().unwrap_err()), "bad");
        assert!(engine.wait_all().is_ok(), "wait_all reports an error once");
    });
}

#[test]
fn error_propagates_through_readers_and_is_cleared_by_a_good_write() {
    watchdog(|| {
        let engine = Engine::new(2);
        let (x, y, z) = (Var::new(), Var::new(), Var::new());
        engine.push("bad", &[], from_ref(&x), 0, || Err("boom".into()));
        engine.push("y=f(x)", from_ref(&x), from_ref(&y), 0, || Ok(()));
        engine.push("z=g(y)", from_ref(&y), from_ref(&z), 0, || Ok(()));
        engine.push("x=1", &[], from_ref(&x), 0, || Ok(()));
        // Propagated errors keep the op that raised them.
        assert_eq!(op_of(&engine.wait_to_read(&y).unwrap_err()), "bad");
        assert_eq!(op_of(&engine.wait_to_read(&z).unwrap_err()), "bad");
        assert!(engine.wait_to_read(&x).is_ok(), "the later good write cleared x");
        // Only the raising op is logged engine-wide.
        assert_eq!(op_of(&engine.wait_all().unwrap_err()), "bad");
        assert!(engine.wait_all().is_ok());
        // A good write over an errored var clears it.
        engine.push("y=2", &[], from_ref(&y), 0, || Ok(()));
        engine.push("bad-y", &[], from_ref(&y), 0, || Err("again".into()));
        engine.push("y=3", &[], from_ref(&y), 0, || Ok(()));
        assert!(engine.wait_to_read(&y).is_ok());
        assert_eq!(op_of(&engine.wait_all().unwrap_err()), "bad-y");
    });
}

#[test]
fn a_taking_op_moves_the_error_off_its_read_var() {
    watchdog(|| {
        let engine = Engine::new(2);
        let (x, y1, y2) = (Var::new(), Var::new(), Var::new());
        engine.push("bad", &[], from_ref(&x), 0, || Err("boom".into()));
        engine.push_taking_errors("pull1", from_ref(&x), from_ref(&y1), 0, || Ok(()));
        engine.push_taking_errors("pull2", from_ref(&x), from_ref(&y2), 0, || Ok(()));
        // Reported once, on the first taker's output; x and the second output are clean.
        assert_eq!(op_of(&engine.wait_to_read(&y1).unwrap_err()), "bad");
        assert!(engine.wait_to_read(&y2).is_ok(), "the first taker moved the error");
        assert!(engine.wait_to_read(&x).is_ok(), "x's error was moved, not copied");
        assert_eq!(op_of(&engine.wait_all().unwrap_err()), "bad");
    });
}

#[test]
fn first_read_var_error_wins_and_own_error_beats_inherited() {
    watchdog(|| {
        // One thread, so "bad-a" is the first error raised (the log keeps completion order).
        let engine = Engine::new(1);
        let (a, b, out, out2) = (Var::new(), Var::new(), Var::new(), Var::new());
        engine.push("bad-a", &[], from_ref(&a), 0, || Err("a".into()));
        engine.push("bad-b", &[], from_ref(&b), 0, || Err("b".into()));
        engine.push("join", &[b.clone(), a.clone()], from_ref(&out), 0, || Ok(()));
        engine.push("own", from_ref(&a), from_ref(&out2), 0, || Err("own".into()));
        assert_eq!(op_of(&engine.wait_to_read(&out).unwrap_err()), "bad-b");
        assert_eq!(op_of(&engine.wait_to_read(&out2).unwrap_err()), "own");
        assert_eq!(op_of(&engine.wait_all().unwrap_err()), "bad-a");
    });
}

#[test]
fn in_place_update_keeps_the_error() {
    watchdog(|| {
        let engine = Engine::new(1);
        let x = Var::new();
        engine.push("bad", &[], from_ref(&x), 0, || Err("boom".into()));
        engine.push("x+=1", from_ref(&x), from_ref(&x), 0, || Ok(()));
        assert_eq!(op_of(&engine.wait_to_read(&x).unwrap_err()), "bad");
        let _ = engine.wait_all();
    });
}

#[test]
fn wait_clears_before_later_reader_is_unaffected() {
    watchdog(|| {
        let engine = Engine::new(1);
        let (x, y) = (Var::new(), Var::new());
        engine.push("bad", &[], from_ref(&x), 0, || Err("boom".into()));
        assert!(engine.wait_to_read(&x).is_err());
        engine.push("y=f(x)", from_ref(&x), from_ref(&y), 0, || Ok(()));
        assert!(engine.wait_to_read(&y).is_ok(), "the wait cleared x before y read it");
        let _ = engine.wait_all();
    });
}

#[test]
fn panic_is_caught_and_the_pool_survives() {
    watchdog(|| {
        let engine = Engine::new(1);
        let x = Var::new();
        engine.push("explode", &[], from_ref(&x), 0, || panic!("kaboom"));
        match engine.wait_to_read(&x).unwrap_err() {
            Error::Panicked { op, message } => {
                assert_eq!(op, "explode");
                assert_eq!(message, "kaboom");
            }
            other => panic!("expected a panic error, got {other}"),
        }
        assert!(matches!(engine.wait_all(), Err(Error::Panicked { .. })));
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        engine.push("after", &[], from_ref(&x), 0, move || {
            flag.store(true, Ordering::SeqCst);
            Ok(())
        });
        engine.wait_all().unwrap();
        assert!(ran.load(Ordering::SeqCst), "the only pool thread died");
    });
}

#[test]
fn dropped_completion_fails_the_op() {
    watchdog(|| {
        let engine = Engine::new(1);
        let x = Var::new();
        engine.push_async("forgot", &[], from_ref(&x), 0, drop);
        assert!(matches!(engine.wait_to_read(&x), Err(Error::Dropped { op: "forgot" })));
        assert!(matches!(engine.wait_all(), Err(Error::Dropped { .. })));
    });
}

#[test]
fn completion_moved_off_the_pool_and_dropped_fails_the_op() {
    watchdog(|| {
        let engine = Engine::new(1);
        let x = Var::new();
        engine.push_async("lost", &[], from_ref(&x), 0, |c| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(10));
                drop(c);
            });
        });
        assert!(matches!(engine.wait_to_read(&x), Err(Error::Dropped { op: "lost" })));
        let _ = engine.wait_all();
    });
}

#[test]
fn async_panic_is_reported_as_a_panic() {
    watchdog(|| {
        let engine = Engine::new(1);
        let x = Var::new();
        engine.push_async("async-explode", &[], from_ref(&x), 0, |c| {
            let _keep = c;
            panic!("async kaboom");
        });
        assert!(matches!(engine.wait_to_read(&x), Err(Error::Panicked { op: "async-explode", .. })));
        // Completing first and then panicking: the vars are fine, but wait_all hears of it.
        let y = Var::new();
        engine.push_async("done-then-panic", &[], from_ref(&y), 0, |c| {
            c.done();
            panic!("late");
        });
        let _ = engine.wait_all();
        engine.push("sync-after", &[], from_ref(&y), 0, || Ok(()));
        assert!(engine.wait_to_read(&y).is_ok());
        assert!(engine.wait_all().is_ok());
        engine.push_async("done-then-panic", &[], from_ref(&y), 0, |c| {
            c.done();
            panic!("late");
        });
        assert!(matches!(engine.wait_all(), Err(Error::Panicked { op: "done-then-panic", .. })));
    });
}

#[test]
fn async_op_completes_from_another_thread() {
    watchdog(|| {
        let engine = Engine::new(1);
        let x = Var::new();
        let landed = Arc::new(AtomicBool::new(false));
        let gate = Gate::default();
        {
            let (landed, gate) = (landed.clone(), gate.clone());
            engine.push_async("net", &[], from_ref(&x), 0, move |c| {
                std::thread::spawn(move || {
                    assert!(gate.wait());
                    landed.store(true, Ordering::SeqCst);
                    c.done();
                });
            });
        }
        let saw = Arc::new(AtomicBool::new(false));
        {
            let (landed, saw) = (landed.clone(), saw.clone());
            engine.push("consume", from_ref(&x), &[], 0, move || {
                saw.store(landed.load(Ordering::SeqCst), Ordering::SeqCst);
                Ok(())
            });
        }
        // The pool is free while the async op is in flight.
        let free = Gate::default();
        let flag = free.clone();
        engine.push("independent", &[], &[Var::new()], 0, move || {
            flag.open();
            Ok(())
        });
        assert!(free.wait(), "an in-flight async op held the only thread");
        gate.open();
        engine.wait_to_read(&x).unwrap();
        engine.wait_all().unwrap();
        assert!(saw.load(Ordering::SeqCst), "the reader ran before the async write completed");

        engine.push_async("net-fail", &[], from_ref(&x), 0, |c| {
            std::thread::spawn(move || c.fail("connection reset".into()));
        });
        let err = engine.wait_to_read(&x).unwrap_err();
        assert!(matches!(err, Error::Failed { op: "net-fail", .. }));
        assert!(engine.wait_all().is_err());
    });
}

#[test]
fn certain_self_deadlocks_panic_instead_of_hanging() {
    watchdog(|| {
        let engine = Engine::new(1);
        let x = Var::new();
        let inner = engine.clone();
        engine.push("wait-all-inside", &[], &[], 0, move || Ok(inner.wait_all()?));
        assert!(matches!(engine.wait_all(), Err(Error::Panicked { op: "wait-all-inside", .. })));
        let (inner, var) = (engine.clone(), x.clone());
        engine.push("wait-own-write", &[], from_ref(&x), 0, move || Ok(inner.wait_to_read(&var)?));
        assert!(matches!(engine.wait_to_read(&x), Err(Error::Panicked { .. })));
        let (inner, var) = (engine.clone(), x.clone());
        engine.push("wait-write-own-read", from_ref(&x), &[], 0, move || Ok(inner.wait_to_write(&var)?));
        assert!(matches!(engine.wait_all(), Err(Error::Panicked { .. })));
    });
}

//! Wait tests: what `wait_to_read`, `wait_to_write` and `wait_all` wait for, waits from inside
//! ops, and the global engine's configuration.

use std::slice::from_ref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use super::{watchdog, Gate, LIMIT};
use crate::engine::scheduler::threads_from;
use crate::engine::{Engine, Error, Var};

/// A read of `v` that blocks until `gate` opens; `started` opens when it runs.
fn blocked_read(engine: &Engine, v: &Var, started: &Gate, gate: &Gate) {
    let (started, gate) = (started.clone(), gate.clone());
    engine.push("slow-read", from_ref(v), &[], 0, move || {
        started.open();
        assert!(gate.wait());
        Ok(())
    });
}

/// Starts `wait_to_write` (`write`) or `wait_to_read` of `var` on a thread of its own: its
/// handle, and a receiver that hears when the wait returned.
fn waiting(engine: &Engine, var: &Var, write: bool) -> (std::thread::JoinHandle<Result<(), Error>>, mpsc::Receiver<()>) {
    let (tx, rx) = mpsc::channel();
    let (e, var) = (engine.clone(), var.clone());
    let handle = std::thread::spawn(move || {
        let result = if write { e.wait_to_write(&var) } else { e.wait_to_read(&var) };
        let _ = tx.send(());
        result
    });
    (handle, rx)
}

#[test]
fn wait_to_write_waits_for_readers_but_wait_to_read_does_not() {
    watchdog(|| {
        let engine = Engine::new(2);
        let v = Var::new();
        let (started, gate) = (Gate::default(), Gate::default());
        blocked_read(&engine, &v, &started, &gate);
        assert!(started.wait());
        // No write is pending: reading may proceed beside the reader.
        engine.wait_to_read(&v).unwrap();
        let (waiter, rx) = waiting(&engine, &v, true);
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "wait_to_write returned while a reader was running");
        gate.open();
        rx.recv_timeout(LIMIT).expect("wait_to_write never returned");
        waiter.join().unwrap().unwrap();
        engine.wait_all().unwrap();
    });
}

#[test]
fn wait_to_read_waits_for_earlier_writes_only() {
    watchdog(|| {
        let engine = Engine::new(2);
        let v = Var::new();
        let gate = Gate::default();
        let wrote = Arc::new(AtomicBool::new(false));
        {
            let (gate, wrote) = (gate.clone(), wrote.clone());
            engine.push_async("slow-write", &[], from_ref(&v), 0, move |c| {
                std::thread::spawn(move || {
                    assert!(gate.wait());
                    wrote.store(true, Ordering::SeqCst);
                    c.done();
                });
            });
        }
        let opener = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                gate.open();
            })
        };
        engine.wait_to_read(&v).unwrap();
        assert!(wrote.load(Ordering::SeqCst), "wait_to_read returned before the write");
        opener.join().unwrap();
        engine.wait_all().unwrap();
    });
}

#[test]
fn wait_all_waits_for_async_ops_and_their_followers() {
    watchdog(|| {
        let engine = Engine::new(2);
        let v = Var::new();
        let finished = Arc::new(AtomicBool::new(false));
        engine.push_async("net", &[], from_ref(&v), 0, |c| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                c.done();
            });
        });
        let flag = finished.clone();
        engine.push("after", from_ref(&v), &[], 0, move || {
            flag.store(true, Ordering::SeqCst);
            Ok(())
        });
        engine.wait_all().unwrap();
        assert!(finished.load(Ordering::SeqCst));
    });
}

#[test]
fn waiting_inside_an_op_on_finished_work_does_not_deadlock() {
    watchdog(|| {
        let engine = Engine::new(1);
        let (done, busy) = (Var::new(), Var::new());
        engine.push("write", &[], from_ref(&done), 0, || Ok(()));
        engine.wait_to_read(&done).unwrap();
        let inner = engine.clone();
        let (d, b) = (done.clone(), busy.clone());
        engine.push("waits-inside", &[], &[], 0, move || {
            inner.wait_to_read(&d)?;
            inner.wait_to_write(&d)?;
            // A var this op only reads can be waited on for reading.
            let _ = b;
            Ok(())
        });
        let inner = engine.clone();
        let b = busy.clone();
        engine.push("reads-and-waits", from_ref(&busy), &[], 0, move || inner.wait_to_read(&b).map_err(Into::into));
        engine.wait_all().unwrap();
    });
}

#[test]
fn waits_on_idle_vars_return_at_once() {
    watchdog(|| {
        let engine = Engine::new(1);
        let v = Var::new();
        engine.wait_to_read(&v).unwrap();
        engine.wait_to_write(&v).unwrap();
        engine.wait_all().unwrap();
    });
}

#[test]
fn global_engine_is_shared_and_thread_count_parses() {
    watchdog(|| {
        let engine = Engine::global();
        assert!(std::ptr::eq(engine, Engine::global()));
        assert!(engine.threads() >= 1);
        let v = Var::new();
        engine.push("global", &[], from_ref(&v), 0, || Ok(()));
        engine.wait_to_read(&v).unwrap();
    });
    let default = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(threads_from(Some("3")), 3);
    assert_eq!(threads_from(Some(" 8 ")), 8);
    assert_eq!(threads_from(Some("0")), default);
    assert_eq!(threads_from(Some("lots")), default);
    assert_eq!(threads_from(Some("-2")), default);
    assert_eq!(threads_from(None), default);
    assert_eq!(Engine::new(0).threads(), 1);
}

#[test]
fn begin_wait_to_write_completes_after_earlier_ops_only_and_keeps_the_error() {
    watchdog(|| {
        let engine = Engine::new(2);
        let v = Var::new();
        let (started, gate) = (Gate::default(), Gate::default());
        blocked_read(&engine, &v, &started, &gate);
        engine.push("fail", &[], from_ref(&v), 0, || Err("bad write".into()));
        let pending = engine.begin_wait_to_write(&v);
        // An op pushed after the wait began does not delay it.
        let (later_started, later_gate) = (Gate::default(), Gate::default());
        blocked_read(&engine, &v, &later_started, &later_gate);
        assert!(started.wait());
        std::thread::sleep(Duration::from_millis(20));
        assert!(!pending.is_done(), "done while an earlier reader still runs");
        gate.open();
        while !pending.is_done() {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(pending.wait().is_err(), "the earlier write's error is returned");
        assert!(later_started.wait(), "the later op runs once the wait is granted");
        later_gate.open();
        // Already settled: a wait that starts now is done at once.
        engine.wait_to_write(&v).unwrap();
        let settled = engine.begin_wait_to_write(&v);
        assert!(settled.is_done());
        settled.wait().unwrap();
        let _ = engine.wait_all();
    });
}

#[test]
fn a_consuming_async_op_releases_its_reads_when_its_closure_returns() {
    watchdog(|| {
        let engine = Engine::new(2);
        let (input, output) = (Var::new(), Var::new());
        let (tx, rx) = mpsc::channel();
        engine.push_async_consuming("consume", from_ref(&input), from_ref(&output), 0, move |done| {
            // The network part: completes later, from another thread.
            tx.send(done).unwrap();
        });
        let done = rx.recv_timeout(LIMIT).expect("the op ran");
        // The closure returned: the input is free, the output is not.
        engine.wait_to_write(&input).unwrap();
        let written = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&written);
        engine.push("reuse-input", &[], from_ref(&input), 0, move || {
            flag.store(true, Ordering::SeqCst);
            Ok(())
        });
        engine.wait_to_read(&input).unwrap();
        assert!(written.load(Ordering::SeqCst), "a later write of the input ran before the op completed");
        let (waiter, orx) = waiting(&engine, &output, false);
        assert!(orx.recv_timeout(Duration::from_millis(50)).is_err(), "the output was readable before the op completed");
        done.fail("the server went away".into());
        assert!(waiter.join().unwrap().is_err(), "the failure is recorded on the output");
        engine.wait_to_write(&input).unwrap();
        assert!(engine.wait_all().is_err());
    });
}

#[test]
fn a_lending_op_holds_its_reads_until_the_lease_drops_even_after_it_completed() {
    watchdog(|| {
        let engine = Engine::new(2);
        let (input, output) = (Var::new(), Var::new());
        let (tx, rx) = mpsc::channel();
        engine.push_async_lending("lend", from_ref(&input), from_ref(&output), 0, move |done, lease| {
            tx.send((done, lease)).unwrap();
        });
        let (done, lease) = rx.recv_timeout(LIMIT).expect("the op ran");
        // The op completes while the lease (the bytes on their way) is still out.
        done.done();
        engine.wait_to_read(&output).unwrap();
        // Reads of the input are never held up by a lease.
        engine.wait_to_read(&input).unwrap();
        let (writer, wrx) = waiting(&engine, &input, true);
        assert!(wrx.recv_timeout(Duration::from_millis(50)).is_err(), "the input was writable while its lease was out");
        drop(lease);
        wrx.recv_timeout(LIMIT).expect("dropping the lease frees the input");
        writer.join().unwrap().unwrap();
        engine.wait_all().unwrap();
    });
}

#[test]
fn a_lending_op_frees_its_reads_when_the_lease_drops_before_it_completes() {
    watchdog(|| {
        let engine = Engine::new(2);
        let (input, output) = (Var::new(), Var::new());
        let (tx, rx) = mpsc::channel();
        engine.push_async_lending("lend", from_ref(&input), from_ref(&output), 0, move |done, lease| {
            drop(lease);
            tx.send(done).unwrap();
        });
        let done = rx.recv_timeout(LIMIT).expect("the op ran");
        engine.wait_to_write(&input).unwrap();
        let (waiter, orx) = waiting(&engine, &output, false);
        assert!(orx.recv_timeout(Duration::from_millis(50)).is_err(), "the output was readable before the op completed");
        done.done();
        waiter.join().unwrap().unwrap();
        engine.wait_all().unwrap();
    });
}

#[test]
fn a_lending_op_whose_closure_panics_releases_everything() {
    watchdog(|| {
        let engine = Engine::new(2);
        let (input, output) = (Var::new(), Var::new());
        engine.push_async_lending("lend", from_ref(&input), from_ref(&output), 0, move |_done, _lease| {
            panic!("boom");
        });
        engine.wait_to_write(&input).unwrap();
        assert!(engine.wait_to_read(&output).is_err());
        assert!(engine.wait_all().is_err());
    });
}

//! Ordering tests: concurrency of independent ops and of reads, submission order per var,
//! priorities, vars shared across engines, and draining at shutdown.

use std::slice::from_ref;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{watchdog, Gate, Log, Rendezvous};
use crate::engine::{Engine, Var};

#[test]
fn ops_on_distinct_vars_run_concurrently() {
    watchdog(|| {
        let engine = Engine::new(2);
        let (a, b) = (Var::new(), Var::new());
        let meet = Rendezvous::new(2);
        let met = Log::default();
        for var in [&a, &b] {
            let (meet, met) = (meet.clone(), met.clone());
            engine.push("meet", &[], from_ref(var), 0, move || {
                met.push(meet.arrive());
                Ok(())
            });
        }
        engine.wait_all().unwrap();
        assert_eq!(met.snapshot(), [true, true], "the two writers never overlapped");
    });
}

#[test]
fn reads_of_one_var_run_concurrently() {
    watchdog(|| {
        let engine = Engine::new(2);
        let v = Var::new();
        engine.push("init", &[], from_ref(&v), 0, || Ok(()));
        let meet = Rendezvous::new(2);
        let met = Log::default();
        for _ in 0..2 {
            let (meet, met) = (meet.clone(), met.clone());
            engine.push("read", from_ref(&v), &[], 0, move || {
                met.push(meet.arrive());
                Ok(())
            });
        }
        engine.wait_all().unwrap();
        assert_eq!(met.snapshot(), [true, true], "the two readers never overlapped");
    });
}

#[test]
fn writes_to_one_var_keep_submission_order() {
    watchdog(|| {
        let engine = Engine::new(4);
        let v = Var::new();
        let log = Log::default();
        for i in 0..500 {
            let log = log.clone();
            engine.push("write", &[], from_ref(&v), i % 7, move || {
                log.push(i);
                Ok(())
            });
        }
        engine.wait_to_read(&v).unwrap();
        assert_eq!(log.snapshot(), (0..500).collect::<Vec<_>>());
        engine.wait_all().unwrap();
    });
}

#[test]
fn reads_see_the_latest_earlier_write() {
    watchdog(|| {
        let engine = Engine::new(4);
        let v = Var::new();
        let value = Arc::new(AtomicUsize::new(0));
        let seen = Log::default();
        let mut last_write = 0;
        // W R R W R W W R R R W R ...: a fixed pseudo-random mix.
        for i in 1..400usize {
            if (i * 7919) % 5 < 2 {
                last_write = i;
                let value = value.clone();
                engine.push("write", &[], from_ref(&v), 0, move || {
                    std::thread::yield_now();
                    value.store(i, Ordering::SeqCst);
                    Ok(())
                });
            } else {
                let (value, seen) = (value.clone(), seen.clone());
                engine.push("read", from_ref(&v), &[], 0, move || {
                    std::thread::yield_now();
                    seen.push((last_write, value.load(Ordering::SeqCst)));
                    Ok(())
                });
            }
        }
        engine.wait_all().unwrap();
        let seen = seen.snapshot();
        assert!(seen.len() > 100);
        for (expected, got) in seen {
            assert_eq!(expected, got, "a read saw the wrong write");
        }
    });
}

#[test]
fn var_in_reads_and_writes_is_a_write() {
    watchdog(|| {
        let engine = Engine::new(2);
        let v = Var::new();
        let gate = Gate::default();
        let reading = Arc::new(AtomicBool::new(false));
        {
            let (gate, reading) = (gate.clone(), reading.clone());
            engine.push("slow-read", from_ref(&v), &[], 0, move || {
                reading.store(true, Ordering::SeqCst);
                assert!(gate.wait());
                reading.store(false, Ordering::SeqCst);
                Ok(())
            });
        }
        let overlapped = Arc::new(AtomicBool::new(false));
        {
            let (reading, overlapped) = (reading.clone(), overlapped.clone());
            let twice = [v.clone(), v.clone()];
            engine.push("update", &twice, &twice, 0, move || {
                overlapped.store(reading.load(Ordering::SeqCst), Ordering::SeqCst);
                Ok(())
            });
        }
        std::thread::sleep(Duration::from_millis(30));
        gate.open();
        engine.wait_all().unwrap();
        assert!(!overlapped.load(Ordering::SeqCst), "read-write op ran beside a reader");
    });
}

#[test]
fn priority_decides_among_ready_ops() {
    watchdog(|| {
        let engine = Engine::new(1);
        let started = Gate::default();
        let release = Gate::default();
        {
            let (started, release) = (started.clone(), release.clone());
            engine.push("gate", &[], &[], 0, move || {
                started.open();
                assert!(release.wait());
                Ok(())
            });
        }
        assert!(started.wait(), "the gate op never started");
        let order = Log::default();
        for (name, priority) in [("low-1", 0), ("high-1", 10), ("low-2", 0), ("mid", 5), ("high-2", 10)] {
            let order = order.clone();
            engine.push(name, &[Var::new()], &[], priority, move || {
                order.push(name);
                Ok(())
            });
        }
        release.open();
        engine.wait_all().unwrap();
        assert_eq!(order.snapshot(), ["high-1", "high-2", "mid", "low-1", "low-2"]);
    });
}

#[test]
fn op_without_vars_runs() {
    watchdog(|| {
        let engine = Engine::new(1);
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        engine.push("free", &[], &[], 0, move || {
            flag.store(true, Ordering::SeqCst);
            Ok(())
        });
        engine.wait_all().unwrap();
        assert!(ran.load(Ordering::SeqCst));
    });
}

#[test]
fn vars_order_ops_across_engines() {
    watchdog(|| {
        let (e1, e2) = (Engine::new(1), Engine::new(1));
        let v = Var::new();
        let log = Log::default();
        for i in 0..50 {
            let engine = if i % 2 == 0 { &e1 } else { &e2 };
            let log = log.clone();
            engine.push("write", &[], from_ref(&v), 0, move || {
                log.push(i);
                Ok(())
            });
        }
        e1.wait_to_read(&v).unwrap();
        assert_eq!(log.snapshot(), (0..50).collect::<Vec<_>>());
    });
}

#[test]
fn dropping_the_engine_drains_it() {
    watchdog(|| {
        let count = Arc::new(AtomicUsize::new(0));
        let engine = Engine::new(2);
        let v = Var::new();
        for _ in 0..200 {
            let count = count.clone();
            engine.push("count", &[], from_ref(&v), 0, move || {
                count.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
        }
        drop(engine);
        assert_eq!(count.load(Ordering::SeqCst), 200);
    });
}

#[test]
fn last_handle_dropped_inside_an_op() {
    watchdog(|| {
        let engine = Engine::new(2);
        let done = Gate::default();
        let (inner, signal) = (engine.clone(), done.clone());
        engine.push("holds-engine", &[], &[], 0, move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(inner);
            signal.open();
            Ok(())
        });
        drop(engine);
        assert!(done.wait());
    });
}

#[test]
fn concurrent_pushers_with_overlapping_vars_do_not_deadlock() {
    watchdog(|| {
        let engine = Engine::new(2);
        let (a, b) = (Var::new(), Var::new());
        let pushers: Vec<_> = (0..2)
            .map(|t| {
                let (engine, a, b) = (engine.clone(), a.clone(), b.clone());
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        let vars = if (i + t) % 2 == 0 { [a.clone(), b.clone()] } else { [b.clone(), a.clone()] };
                        engine.push("ab", &vars[..1], &vars[1..], 0, || Ok(()));
                    }
                })
            })
            .collect();
        for pusher in pushers {
            pusher.join().unwrap();
        }
        engine.wait_all().unwrap();
    });
}

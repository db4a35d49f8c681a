//! A push releases its input arrays once it has consumed them, before the update runs (issue
//! 6): with an updater, waiting on a pushed array returns while the updater is still blocked,
//! the caller may overwrite the array at once, and the update still sees the pushed values.
//! Pushes of other keys are not held up by a slow update either. (An optimizer step on one
//! synkv-owned array reads it in place; overwriting it waits for the step — either way the
//! step sees the pushed values.)
//!
//! Every wait here is bounded: if a push kept its inputs until the update ran, the waits below
//! would time out and the test fail (never hang).

mod common;

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{assert_all, bounded, STORE_TYPES};
use synkv::engine::Engine;
use synkv::optimizer::{Optimizer, Sgd};
use synkv::{create, Key, NDArray};

const SHAPE: [usize; 2] = [4, 4];
const STEP: Duration = Duration::from_secs(10);

/// The tests here block engine threads on purpose: one at a time.
static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `f` on another thread; true if it finished within `STEP`.
fn finishes(f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(STEP).is_ok()
}

/// An updater `stored += 3 * input` that first tells `started` which key it runs for, then
/// waits (bounded) for a go-ahead on `gate`.
fn gated_updater(started: Sender<Key>, gate: Receiver<()>) -> impl Fn(&Key, &NDArray, &mut NDArray) -> synkv::Result<()> + Send + Sync {
    let started = Mutex::new(started);
    let gate = Mutex::new(gate);
    move |key, input, stored| {
        let _ = started.lock().map(|s| s.send(key.clone()));
        let _ = gate.lock().map(|g| g.recv_timeout(STEP));
        let sum: Vec<f32> = stored.to_vec::<f32>()?.iter().zip(input.to_vec::<f32>()?).map(|(s, i)| s + 3.0 * i).collect();
        NDArray::from_vec(stored.shape().clone(), sum)?.copy_to(stored)?;
        Ok(())
    }
}

#[test]
fn push_with_an_updater_returns_its_inputs_before_the_update_runs() {
    bounded(|| {
        let _turn = turn();
        for ty in STORE_TYPES {
            let kv = Arc::new(create(ty).unwrap());
            kv.init(3, &NDArray::zeros(SHAPE)).unwrap();
            let (started_tx, started) = mpsc::channel();
            let (gate, gate_rx) = mpsc::channel();
            kv.set_updater(gated_updater(started_tx, gate_rx));

            let input = NDArray::full(SHAPE, 2.0);
            kv.push(3, &input).unwrap();
            assert_eq!(started.recv_timeout(STEP).ok(), Some(Key::Int(3)), "{ty}: the updater should have started");
            // The updater is blocked, yet the input is free: overwrite it.
            let free = input.clone();
            assert!(finishes(move || free.wait_to_write().unwrap()), "{ty}: the push still holds its input while the update runs");
            NDArray::full(SHAPE, 100.0).copy_to(&input).unwrap();
            gate.send(()).unwrap();

            let out = NDArray::zeros(SHAPE);
            kv.pull(3, &out).unwrap();
            assert_all(&out, 6.0, &format!("{ty}: the update used the pushed values, not the overwritten ones"));
            kv.wait_all().unwrap();
        }
    });
}

#[test]
fn a_slow_update_does_not_hold_up_pushes_of_other_keys() {
    if Engine::global().threads() < 2 {
        eprintln!("skipped: needs two engine threads (one stays blocked in the updater)");
        return;
    }
    bounded(|| {
        let _turn = turn();
        let kv = Arc::new(create("local").unwrap());
        kv.init(vec![1, 2], vec![&NDArray::zeros(SHAPE), &NDArray::zeros(SHAPE)]).unwrap();
        let (started_tx, started) = mpsc::channel();
        let (gate, gate_rx) = mpsc::channel();
        kv.set_updater(gated_updater(started_tx, gate_rx));

        let a = NDArray::full(SHAPE, 1.0);
        kv.push(1, &a).unwrap();
        assert_eq!(started.recv_timeout(STEP).ok(), Some(Key::Int(1)));
        // Key 1's update is blocked; key 2's push still consumes its input.
        let b = NDArray::full(SHAPE, 2.0);
        kv.push(2, &b).unwrap();
        let free = b.clone();
        assert!(finishes(move || free.wait_to_write().unwrap()), "the push of key 2 waited for key 1's update");
        NDArray::zeros(SHAPE).copy_to(&b).unwrap();
        // Updates still run one at a time, in push order.
        gate.send(()).unwrap();
        assert_eq!(started.recv_timeout(STEP).ok(), Some(Key::Int(2)));
        gate.send(()).unwrap();
        let outs = [NDArray::zeros(SHAPE), NDArray::zeros(SHAPE)];
        kv.pull(vec![1, 2], vec![&outs[0], &outs[1]]).unwrap();
        assert_all(&outs[0], 3.0, "key 1");
        assert_all(&outs[1], 6.0, "key 2");
        kv.wait_all().unwrap();
    });
}

#[test]
fn push_with_an_optimizer_reads_the_values_pushed_and_reuses_the_merge_buffer() {
    bounded(|| {
        let _turn = turn();
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(7, &NDArray::full(SHAPE, 1.0)).unwrap();
            kv.set_optimizer(Optimizer::from(Sgd::default()).with_learning_rate(0.5)).unwrap();
            let grad = NDArray::full(SHAPE, 1.0);
            for _ in 0..3 {
                kv.push(7, &grad).unwrap();
                // Overwriting the gradient right after the push does not change the update.
                grad.wait_to_write().unwrap();
                NDArray::full(SHAPE, 1000.0).copy_to(&grad).unwrap();
                NDArray::full(SHAPE, 1.0).copy_to(&grad).unwrap();
            }
            let out = NDArray::zeros(SHAPE);
            kv.pull(7, &out).unwrap();
            assert_all(&out, 1.0 - 3.0 * 0.5, &format!("{ty}: three SGD steps of lr 0.5 on gradient 1"));
        }
    });
}

#[test]
fn concurrent_pushes_of_one_key_with_an_updater_are_all_applied() {
    bounded(|| {
        let _turn = turn();
        let kv = Arc::new(create("local").unwrap());
        kv.init(5, &NDArray::zeros([64])).unwrap();
        kv.set_updater(|_key: &Key, input: &NDArray, stored: &mut NDArray| {
            let sum: Vec<f32> = stored.to_vec::<f32>()?.iter().zip(input.to_vec::<f32>()?).map(|(s, i)| s + i).collect();
            NDArray::from_vec([64], sum)?.copy_to(stored)?;
            Ok(())
        });
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let kv = Arc::clone(&kv);
                std::thread::spawn(move || {
                    let g = NDArray::ones([64]);
                    for _ in 0..100 {
                        kv.push(5, &g).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let out = NDArray::zeros([64]);
        kv.pull(5, &out).unwrap();
        assert_all(&out, 400.0, "every push of every thread is applied once");
    });
}

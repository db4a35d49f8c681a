//! The engine's ordering, seen through the store: operations on one key issued back to back
//! without waits run in issue order (push → pull → push ...), large list calls give the right
//! numbers, and a priority is accepted on every operation without breaking that order.

mod common;

use std::sync::{Arc, Mutex};

use common::{assert_all, bounded, per_device, with_timeout, STORE_TYPES};
use synkv::engine::Priority;
use synkv::store::PullOptions;
use synkv::{create, Context, Key, NDArray};

/// Above the store's batching bound (2^16 elements): every push/pull of it is its own engine op.
const BIG: [usize; 2] = [256, 300];

#[test]
fn push_pull_chains_on_one_key_keep_issue_order() {
    bounded(|| {
        for ty in STORE_TYPES {
            for shape in [vec![4usize, 4], BIG.to_vec()] {
                let kv = create(ty).unwrap();
                kv.init(3, &NDArray::zeros(shape.clone())).unwrap();
                let rounds = if shape == BIG { 12 } else { 100 };
                let mut pulled = Vec::new();
                for i in 1..=rounds {
                    kv.push(3, &NDArray::full(shape.clone(), f64::from(i))).unwrap();
                    let x = NDArray::zeros(shape.clone());
                    kv.pull(3, &x).unwrap();
                    pulled.push((i, x));
                }
                for (i, x) in &pulled {
                    assert_all(x, f64::from(*i), &format!("{ty} {shape:?}: pull after push {i}"));
                }
            }
        }
    });
}

#[test]
fn one_output_reused_across_pulls_and_pushes() {
    bounded(|| {
        for ty in STORE_TYPES {
            // push x, pull into x, push x again ...: every step reads what the previous wrote
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::zeros([8])).unwrap();
            kv.set_updater(|_k: &Key, input: &NDArray, stored: &mut NDArray| {
                stored.axpy_assign(1.0, input)?;
                Ok(())
            });
            let x = NDArray::ones([8]);
            for _ in 0..20 {
                kv.push(3, &x).unwrap();
                kv.pull(3, &x).unwrap();
            }
            // stored_k = stored_{k-1} + x_{k-1}, x_k = stored_k: stored doubles from 1
            assert_all(&x, 2f64.powi(19), &format!("{ty}: 20 dependent rounds"));
        }
    });
}

#[test]
fn a_chain_through_user_arrays_across_keys() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let keys: Vec<i32> = (0..10).collect();
            kv.init(&keys, &keys.iter().map(|_| NDArray::zeros([5])).collect::<Vec<_>>()).unwrap();
            kv.push(0, &NDArray::full([5], 7.0)).unwrap();
            // pull key k into a, push a to key k+1: no waits; the data flows through a
            let a = NDArray::zeros([5]);
            for k in 0..9 {
                kv.pull(k, &a).unwrap();
                a.add_assign_scalar(1.0).unwrap();
                kv.push(k + 1, &a).unwrap();
            }
            let last = NDArray::zeros([5]);
            kv.pull(9, &last).unwrap();
            assert_all(&last, 16.0, &format!("{ty}: 7 + 9 increments"));
        }
    });
}

#[test]
fn updater_sees_pushes_in_issue_order() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init([3, 4], &[NDArray::zeros([2]), NDArray::zeros(BIG)]).unwrap();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let s = Arc::clone(&seen);
            // stored = 10·stored + input: the result depends on the order of the updates
            kv.set_updater(move |k: &Key, input: &NDArray, stored: &mut NDArray| {
                s.lock().unwrap().push((k.clone(), input.to_vec::<f64>()?[0]));
                stored.mul_assign_scalar(10.0)?;
                stored.add_assign(input)?;
                Ok(())
            });
            for d in 1..=5 {
                kv.push([4, 3], vec![&NDArray::full(BIG, f64::from(d)), &NDArray::full([2], f64::from(d))]).unwrap();
            }
            let (o3, o4) = (NDArray::zeros([2]), NDArray::zeros(BIG));
            kv.pull([3, 4], vec![&o3, &o4]).unwrap();
            assert_all(&o3, 12345.0, &format!("{ty}: small key"));
            assert_all(&o4, 12345.0, &format!("{ty}: big key (its own engine op)"));
            let expected: Vec<(Key, f64)> = (1..=5).flat_map(|d| [(Key::Int(3), f64::from(d)), (Key::Int(4), f64::from(d))]).collect();
            assert_eq!(*seen.lock().unwrap(), expected, "{ty}: one call at a time, ascending keys, calls in issue order");
        }
    });
}

#[test]
fn a_thousand_keys_in_one_list_call() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let keys: Vec<i32> = (0..1000).collect();
            let init: Vec<NDArray> = keys.iter().map(|&k| NDArray::full([3], f64::from(k))).collect();
            kv.init(&keys, &init).unwrap();
            let outs: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros([3])).collect();
            kv.pull(&keys, &outs).unwrap();
            for (k, o) in keys.iter().zip(&outs) {
                assert_all(o, f64::from(*k), &format!("{ty}: init of key {k}"));
            }
            let vals: Vec<NDArray> = keys.iter().map(|&k| NDArray::full([3], f64::from(2 * k))).collect();
            kv.push(&keys, &vals).unwrap();
            kv.pull(&keys, &outs).unwrap();
            for (k, o) in keys.iter().zip(&outs) {
                assert_all(o, f64::from(2 * k), &format!("{ty}: push/pull of key {k}"));
            }
            // two devices per key, summed, then pushpull in one call
            let vals: Vec<Vec<NDArray>> = keys.iter().map(|&k| per_device(&[3], 2, f64::from(k))).collect();
            let outs2: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros([3])).collect();
            kv.pushpull(&keys, &vals, &outs2).unwrap();
            for (k, o) in keys.iter().zip(&outs2) {
                assert_all(o, f64::from(2 * k), &format!("{ty}: 2-device pushpull of key {k}"));
            }
            // str keys too
            let kv = create(ty).unwrap();
            let names: Vec<String> = (0..1000).map(|i| format!("w{i}")).collect();
            kv.init(&names, &init).unwrap();
            let outs: Vec<NDArray> = names.iter().map(|_| NDArray::zeros([3])).collect();
            kv.pushpull(&names, &vals, &outs).unwrap();
            for (i, o) in outs.iter().enumerate() {
                assert_all(o, 2.0 * i as f64, &format!("{ty}: key w{i}"));
            }
        }
    });
}

const PRIORITIES: [Priority; 6] = [0, -1, 1000, -1000, Priority::MAX, Priority::MIN];

#[test]
fn priority_is_accepted_on_every_operation_and_keeps_per_key_order() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let mut checks: Vec<(NDArray, f64, String)> = Vec::new();
            for (i, &p) in PRIORITIES.iter().enumerate() {
                let q = PRIORITIES[(i + 3) % PRIORITIES.len()];
                let key = i as i32;
                let base = 10.0 * i as f64;
                let bo = NDArray::zeros([4]);
                kv.broadcast_with_priority(key, &NDArray::full([4], base), &bo, p).unwrap();
                checks.push((bo, base, format!("broadcast p={p}")));

                kv.push_with_priority(key, &NDArray::full([4], base + 1.0), q).unwrap();
                let o1 = NDArray::zeros([4]);
                let report = kv.pull_with(key, &o1, PullOptions { priority: p, ignore_sparse: true }).unwrap();
                assert!(report.is_complete());
                checks.push((o1, base + 1.0, format!("push p={q} then pull p={p}")));

                let devs = per_device(&[4], 2, base + 2.0);
                let o2 = NDArray::zeros([4]);
                kv.pushpull_with_priority(key, &devs, &o2, q).unwrap();
                checks.push((o2, 2.0 * (base + 2.0), format!("pushpull p={q}")));

                kv.pushpull_in_place_with_priority(key, &devs, p).unwrap();
                for d in &devs {
                    checks.push((d.clone(), 2.0 * (base + 2.0), format!("pushpull in place p={p}")));
                }

                kv.push_with_priority(key, &NDArray::full([4], base + 3.0), p).unwrap();
                let o3 = NDArray::zeros([4]);
                kv.pull_with(key, &o3, PullOptions { priority: q, ignore_sparse: true }).unwrap();
                checks.push((o3, base + 3.0, format!("push p={p} then pull p={q}")));
            }
            for (out, expected, what) in &checks {
                assert_all(out, *expected, &format!("{ty}: {what}"));
            }
        }
    });
}

#[test]
fn low_priority_push_is_not_overtaken_by_a_high_priority_pull() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::zeros(BIG)).unwrap();
            let mut outs = Vec::new();
            for i in 1..=6 {
                kv.push_with_priority(3, &NDArray::full(BIG, f64::from(i)), Priority::MIN).unwrap();
                let o = NDArray::zeros(BIG);
                kv.pull_with(3, &o, PullOptions { priority: Priority::MAX, ignore_sparse: true }).unwrap();
                outs.push((i, o));
            }
            for (i, o) in &outs {
                assert_all(o, f64::from(*i), &format!("{ty}: pull {i}"));
            }
        }
    });
}

#[test]
fn several_threads_on_one_store() {
    with_timeout(60, || {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let threads = 4;
            let keys_per_thread = 8;
            let all: Vec<i32> = (0..threads * keys_per_thread).collect();
            kv.init(&all, &all.iter().map(|_| NDArray::zeros([16])).collect::<Vec<_>>()).unwrap();
            std::thread::scope(|s| {
                for t in 0..threads {
                    let kv = &kv;
                    s.spawn(move || {
                        let keys: Vec<i32> = (t * keys_per_thread..(t + 1) * keys_per_thread).collect();
                        let mut checks = Vec::new();
                        for round in 1..=50 {
                            let vals: Vec<Vec<NDArray>> = keys
                                .iter()
                                .map(|&k| {
                                    (0..2)
                                        .map(|d| NDArray::full_with([16], f64::from(k * 1000 + round), synkv::DType::F32, Context::cpu(d)))
                                        .collect()
                                })
                                .collect();
                            kv.push(&keys, &vals).unwrap();
                            let outs: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros([16])).collect();
                            kv.pull(&keys, &outs).unwrap();
                            for (&k, o) in keys.iter().zip(outs) {
                                checks.push((o, 2.0 * f64::from(k * 1000 + round), format!("thread {t} key {k} round {round}")));
                            }
                        }
                        for (o, expected, what) in &checks {
                            assert_all(o, *expected, what);
                        }
                    });
                }
            });
            kv.wait_all().unwrap();
        }
    });
}

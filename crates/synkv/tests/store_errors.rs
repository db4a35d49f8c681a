//! Every error a `local` / `device` store returns: the typed variant, a message that names the
//! key (or the offending input) and says how to fix the call, and a store that still works
//! afterwards. Asynchronous errors (a failing or panicking updater) surface from the next wait
//! on an affected array or from `wait_all`.

mod common;

use std::fmt::Display;
use std::sync::{Arc, Mutex, MutexGuard};

use common::{assert_all, bounded, outside_a_job, per_device, STORE_TYPES};
use synkv::ndarray::Buffer;
use synkv::store::{Error as StoreError, KeyKind, PullOptions};
use synkv::{create, engine, Context, DType, Error, KVStore, Key, NDArray, Shape};

const SHAPE: [usize; 2] = [2, 2];

/// The store error inside `res`, or a panic saying what came instead.
#[track_caller]
fn store_err<T: std::fmt::Debug>(res: synkv::Result<T>, what: &str) -> StoreError {
    match res {
        Err(Error::Store(e)) => e,
        other => panic!("{what}: expected a store error, got {other:?}"),
    }
}

/// Asserts that the message of `e` contains every needle.
#[track_caller]
fn assert_msg(e: &impl Display, needles: &[&str]) {
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} should contain {n:?}");
    }
}

/// Pulls `key` into a fresh array of `shape` and asserts every element is `expected`.
#[track_caller]
fn assert_stored(kv: &KVStore, key: impl Into<Key>, shape: &[usize], expected: f64, what: &str) {
    let key = key.into();
    let out = NDArray::full(shape.to_vec(), -777.0);
    kv.pull(&key, &out).unwrap_or_else(|e| panic!("{what}: pull {key}: {e}"));
    assert_all(&out, expected, what);
}

/// Pushes `value` to `key` (assign) and checks that a pull returns it: the store works.
#[track_caller]
fn assert_usable(kv: &KVStore, key: impl Into<Key>, shape: &[usize], what: &str) {
    let key = key.into();
    kv.push(&key, &NDArray::full(shape.to_vec(), 6.5)).unwrap_or_else(|e| panic!("{what}: push after the error: {e}"));
    assert_stored(kv, key, shape, 6.5, &format!("{what}: push/pull after the error"));
}

#[test]
fn pull_push_pushpull_of_an_uninitialised_key() {
    bounded(|| {
        for ty in STORE_TYPES {
            for (key, other) in [(Key::Int(3), Key::Int(4)), (Key::from("w"), Key::from("v"))] {
                let kv = create(ty).unwrap();
                kv.init(&other, &NDArray::ones(SHAPE)).unwrap();
                let a = NDArray::full(SHAPE, 2.0);
                for (op, res) in [
                    ("pull", kv.pull(&key, &a)),
                    ("push", kv.push(&key, &a)),
                    ("push", kv.push(&key, &per_device(&SHAPE, 3, 1.0))),
                    ("pushpull", kv.pushpull(&key, &a, &a)),
                ] {
                    let e = store_err(res, &format!("{ty} {op} of uninitialised {key}"));
                    match &e {
                        StoreError::NotInitialized { op: o, key: k } => {
                            assert_eq!(k, &key);
                            // pushpull reports the half that failed
                            assert_eq!(*o, op, "the error names the call");
                        }
                        other => panic!("{ty} {op}: expected NotInitialized, got {other:?}"),
                    }
                    assert_msg(&e, &[&format!("key {key}"), &format!("init({key}")]);
                }
                assert_all(&a, 2.0, &format!("{ty}: the failed calls wrote nothing"));
                // the store works, and the key can still be initialised
                assert_usable(&kv, other.clone(), &SHAPE, ty);
                kv.init(&key, &NDArray::full(SHAPE, 3.0)).unwrap();
                assert_stored(&kv, key, &SHAPE, 3.0, &format!("{ty}: init after the errors"));
            }
        }
    });
}

#[test]
fn a_failed_first_call_does_not_fix_the_key_kind() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let a = NDArray::ones(SHAPE);
            assert!(matches!(store_err(kv.pull("s", &a), ty), StoreError::NotInitialized { .. }));
            assert!(matches!(store_err(kv.push("s", &a), ty), StoreError::NotInitialized { .. }));
            // the store is unchanged: int keys are still allowed
            kv.init(3, &a).unwrap();
            assert_stored(&kv, 3, &SHAPE, 1.0, ty);
        }
    });
}

#[test]
fn duplicate_init_across_calls_within_a_call_and_by_broadcast() {
    bounded(|| {
        for ty in STORE_TYPES {
            for (k, k2, k3) in [(Key::Int(3), Key::Int(4), Key::Int(5)), (Key::from("w"), Key::from("x"), Key::from("y"))] {
                let kv = create(ty).unwrap();
                kv.init(&k, &NDArray::full(SHAPE, 1.0)).unwrap();

                // across calls
                let e = store_err(kv.init(&k, &NDArray::full(SHAPE, 9.0)), &format!("{ty} re-init {k}"));
                assert!(matches!(&e, StoreError::DuplicateInit { key } if *key == k), "{e:?}");
                assert_msg(&e, &[&format!("key {k}"), "push"]);
                assert_stored(&kv, &k, &SHAPE, 1.0, &format!("{ty}: the first init value is kept"));

                // within one call: nothing of the call is initialised
                let (a, b, c) = (NDArray::full(SHAPE, 4.0), NDArray::full(SHAPE, 5.0), NDArray::full(SHAPE, 6.0));
                let e = store_err(kv.init(vec![k2.clone(), k3.clone(), k3.clone()], vec![&a, &b, &c]), &format!("{ty} init [k2, k3, k3]"));
                assert!(matches!(&e, StoreError::DuplicateInit { key } if *key == k3), "{e:?}");
                assert_msg(&e, &[&format!("key {k3}")]);
                for key in [&k2, &k3] {
                    let err = store_err(kv.pull(key, &a), &format!("{ty}: {key} must not be initialised by the failed call"));
                    assert!(matches!(err, StoreError::NotInitialized { .. }), "{err:?}");
                }
                // a key repeated in one call that also already exists
                let e = store_err(kv.init(vec![k2.clone(), k.clone()], vec![&a, &b]), &format!("{ty} init [k2, k]"));
                assert!(matches!(&e, StoreError::DuplicateInit { key } if *key == k), "{e:?}");
                assert!(matches!(store_err(kv.pull(&k2, &a), ty), StoreError::NotInitialized { .. }));

                // broadcast of an existing key: an error, the output untouched, the value kept
                let out = NDArray::full(SHAPE, 7.0);
                let e = store_err(kv.broadcast(&k, &NDArray::full(SHAPE, 8.0), &out), &format!("{ty} broadcast {k}"));
                assert!(matches!(&e, StoreError::DuplicateInit { key } if *key == k), "{e:?}");
                assert_msg(&e, &[&format!("key {k}"), "push"]);
                assert_all(&out, 7.0, &format!("{ty}: a failed broadcast writes no output"));
                assert_stored(&kv, &k, &SHAPE, 1.0, &format!("{ty}: a failed broadcast keeps the value"));

                // a second broadcast of a key broadcast once
                kv.broadcast(&k2, &NDArray::full(SHAPE, 2.0), &out).unwrap();
                assert_all(&out, 2.0, &format!("{ty} broadcast {k2}"));
                let e = store_err(kv.broadcast(&k2, &NDArray::full(SHAPE, 3.0), &out), &format!("{ty} second broadcast {k2}"));
                assert!(matches!(&e, StoreError::DuplicateInit { key } if *key == k2), "{e:?}");
                assert_all(&out, 2.0, &format!("{ty}: the second broadcast wrote nothing"));

                assert_usable(&kv, &k, &SHAPE, ty);
                assert_usable(&kv, &k2, &SHAPE, ty);
            }
        }
    });
}

#[test]
fn mixed_key_kinds_store_fixed_by_first_call() {
    bounded(|| {
        for ty in STORE_TYPES {
            for (good, bad) in [(Key::Int(3), Key::from("x")), (Key::from("x"), Key::Int(3))] {
                let kv = create(ty).unwrap();
                kv.init(&good, &NDArray::ones(SHAPE)).unwrap();
                let (store, got) = (good.kind(), bad.kind());
                let a = NDArray::full(SHAPE, 5.0);
                let checks: Vec<(&str, synkv::Result<()>)> = vec![
                    ("init", kv.init(&bad, &a)),
                    ("push", kv.push(&bad, &a)),
                    ("pull", kv.pull(&bad, &a)),
                    ("pushpull", kv.pushpull(&bad, &a, &a)),
                    ("broadcast", kv.broadcast(&bad, &a, &a)),
                    // a list mixing a valid key and a key of the other kind
                    ("push", kv.push(vec![good.clone(), bad.clone()], vec![&a, &a])),
                ];
                for (op, res) in checks {
                    let e = store_err(res, &format!("{ty} {op} {bad}"));
                    match &e {
                        StoreError::MixedKeyKinds { store: s, got: g, key, .. } => {
                            assert_eq!((*s, *g, key), (store, got, &bad), "{ty} {op}");
                        }
                        other => panic!("{ty} {op}: expected MixedKeyKinds, got {other:?}"),
                    }
                    // names the key, and the kind this store takes (how to fix the call)
                    assert_msg(&e, &[&format!("key {bad}"), &format!("uses {store} keys"), "mixed key types"]);
                }
                assert_all(&a, 5.0, &format!("{ty}: no failed call wrote an output"));
                assert_stored(&kv, &good, &SHAPE, 1.0, &format!("{ty}: the list push with a bad key changed nothing"));
                assert_usable(&kv, &good, &SHAPE, ty);
            }
        }
    });
}

#[test]
fn mixed_key_kinds_in_one_call() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let (a, b) = (NDArray::ones(SHAPE), NDArray::ones(SHAPE));
            let e = store_err(kv.init(vec![Key::Int(1), Key::from("a")], vec![&a, &b]), ty);
            assert!(
                matches!(&e, StoreError::MixedKeyKinds { op: "init", store: KeyKind::Int, got: KeyKind::Str, key } if *key == Key::from("a")),
                "{e:?}"
            );
            assert_msg(&e, &["key a", "uses int keys"]);
            // nothing was initialised and the kind is still open: str keys work now
            assert!(matches!(store_err(kv.pull(1, &a), ty), StoreError::NotInitialized { .. }));
            kv.init("b", &NDArray::full(SHAPE, 2.0)).unwrap();
            assert_stored(&kv, "b", &SHAPE, 2.0, ty);
            let e = store_err(kv.init(vec![Key::from("c"), Key::Int(1)], vec![&a, &b]), ty);
            assert!(matches!(&e, StoreError::MixedKeyKinds { store: KeyKind::Str, got: KeyKind::Int, .. }), "{e:?}");
            assert!(matches!(store_err(kv.pull("c", &a), ty), StoreError::NotInitialized { .. }));
            assert_usable(&kv, "b", &SHAPE, ty);
        }
    });
}

#[test]
fn shape_mismatch_at_push_time() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init([3, 4], &[NDArray::full(SHAPE, 1.0), NDArray::full(SHAPE, 1.0)]).unwrap();
            let wrong = NDArray::ones([4]);
            // the error comes from push itself
            let e = store_err(kv.push(3, &wrong), &format!("{ty} push (4,) into (2, 2)"));
            match &e {
                StoreError::ShapeMismatch { op, key, expected, got } => {
                    assert_eq!((*op, key, expected, got), ("push", &Key::Int(3), &Shape::from(SHAPE), &Shape::from([4])));
                }
                other => panic!("{ty}: expected ShapeMismatch, got {other:?}"),
            }
            // names the key and the shape to use
            assert_msg(&e, &["key 3", "(2, 2)", "(4,)"]);
            assert_stored(&kv, 3, &SHAPE, 1.0, &format!("{ty}: a rejected push changes nothing"));

            // one bad device value among good ones: nothing is applied
            let mut vals = per_device(&SHAPE, 3, 1.0);
            vals.push(NDArray::ones_on([2, 3], Context::cpu(3)));
            let e = store_err(kv.push(3, &vals), ty);
            assert!(matches!(&e, StoreError::ShapeMismatch { op: "push", got, .. } if *got == Shape::from([2, 3])), "{e:?}");
            assert_stored(&kv, 3, &SHAPE, 1.0, &format!("{ty}: no partial multi-device push"));

            // a list push whose second key is wrong: the first key is not pushed either
            let good = NDArray::full(SHAPE, 5.0);
            let e = store_err(kv.push([3, 4], vec![&good, &wrong]), ty);
            assert!(matches!(&e, StoreError::ShapeMismatch { key, .. } if *key == Key::Int(4)), "{e:?}");
            assert_stored(&kv, 3, &SHAPE, 1.0, &format!("{ty}: no partial list push"));

            // pushpull with a wrong value: the push half is rejected, nothing written
            let out = NDArray::full(SHAPE, 9.0);
            let e = store_err(kv.pushpull(3, &wrong, &out), ty);
            assert!(matches!(&e, StoreError::ShapeMismatch { .. }), "{e:?}");
            assert_all(&out, 9.0, &format!("{ty}: a rejected pushpull writes no output"));

            assert_usable(&kv, 3, &SHAPE, ty);
            assert_usable(&kv, 4, &SHAPE, ty);
        }
    });
}

#[test]
fn shape_mismatch_at_pull_time() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init([3, 4], &[NDArray::full(SHAPE, 1.0), NDArray::full(SHAPE, 2.0)]).unwrap();
            let wrong = NDArray::full([2, 3], 9.0);
            let e = store_err(kv.pull(3, &wrong), ty);
            match &e {
                StoreError::ShapeMismatch { op, key, expected, got } => {
                    assert_eq!((*op, key, expected, got), ("pull", &Key::Int(3), &Shape::from(SHAPE), &Shape::from([2, 3])));
                }
                other => panic!("{ty}: expected ShapeMismatch, got {other:?}"),
            }
            assert_msg(&e, &["key 3", "(2, 2)", "(2, 3)"]);
            assert_all(&wrong, 9.0, &format!("{ty}: the bad output is untouched"));

            // a list pull with one bad output writes none of the outputs
            let good = NDArray::full(SHAPE, 9.0);
            let e = store_err(kv.pull([3, 4], vec![&good, &wrong]), ty);
            assert!(matches!(&e, StoreError::ShapeMismatch { key, .. } if *key == Key::Int(4)), "{e:?}");
            assert_all(&good, 9.0, &format!("{ty}: no partial list pull"));

            // pushpull with a bad output: the push is not applied either
            let e = store_err(kv.pushpull(3, &NDArray::full(SHAPE, 4.0), &wrong), ty);
            assert!(matches!(&e, StoreError::ShapeMismatch { op: "pushpull", .. }), "{e:?}");
            assert_stored(&kv, 3, &SHAPE, 1.0, &format!("{ty}: a rejected pushpull does not push"));

            // broadcast with an output of another shape: the key is not initialised
            let e = store_err(kv.broadcast(5, &NDArray::ones(SHAPE), &wrong), ty);
            assert!(matches!(&e, StoreError::ShapeMismatch { op: "broadcast", key, .. } if *key == Key::Int(5)), "{e:?}");
            assert_msg(&e, &["key 5"]);
            assert!(matches!(store_err(kv.pull(5, &good), ty), StoreError::NotInitialized { .. }));

            assert_usable(&kv, 3, &SHAPE, ty);
            kv.broadcast(5, &NDArray::full(SHAPE, 3.0), &good).unwrap();
            assert_all(&good, 3.0, &format!("{ty}: broadcast after the error"));
        }
    });
}

#[test]
fn dtype_mismatch_at_push_time() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::full(SHAPE, 1.0)).unwrap();
            kv.init(4, &NDArray::full_with(SHAPE, 1.0, DType::F64, Context::cpu(0))).unwrap();
            for (key, value, expected, got) in [
                (3, NDArray::full_with(SHAPE, 2.0, DType::F64, Context::cpu(0)), DType::F32, DType::F64),
                (3, NDArray::full_with(SHAPE, 2.0, DType::F16, Context::cpu(0)), DType::F32, DType::F16),
                (4, NDArray::full(SHAPE, 2.0), DType::F64, DType::F32),
            ] {
                let e = store_err(kv.push(key, &value), &format!("{ty} push {got} into {expected}"));
                match &e {
                    StoreError::DTypeMismatch { op, key: k, expected: x, got: g } => {
                        assert_eq!((*op, k, *x, *g), ("push", &Key::Int(key), expected, got));
                    }
                    other => panic!("{ty}: expected DTypeMismatch, got {other:?}"),
                }
                assert_msg(&e, &[&format!("key {key}"), &format!("as_type({expected})")]);
                assert_stored(&kv, key, &SHAPE, 1.0, &format!("{ty}: a rejected push changes nothing"));
            }
            // one device of another dtype among several
            let mut vals = per_device(&SHAPE, 2, 1.0);
            vals.push(NDArray::full_with(SHAPE, 1.0, DType::F64, Context::cpu(2)));
            assert!(matches!(store_err(kv.push(3, &vals), ty), StoreError::DTypeMismatch { .. }));
            assert_stored(&kv, 3, &SHAPE, 1.0, ty);
            assert_usable(&kv, 3, &SHAPE, ty);
            kv.push(4, &NDArray::full_with(SHAPE, 6.5, DType::F64, Context::cpu(0))).unwrap();
            assert_stored(&kv, 4, &SHAPE, 6.5, ty);
        }
    });
}

#[test]
fn empty_key_lists_are_no_ops() {
    bounded(|| {
        // it calls wait_all, which is process-wide: take turns with the tests raising errors
        let _turn = async_turn();
        for ty in STORE_TYPES {
            let none = || Vec::<&NDArray>::new();
            // on a fresh store: nothing happens, and the key kind stays open
            for first in [Key::Int(3), Key::from("s")] {
                let kv = create(ty).unwrap();
                kv.init(Vec::<i32>::new(), none()).unwrap();
                kv.push(Vec::<i32>::new(), none()).unwrap();
                kv.pull(Vec::<i32>::new(), none()).unwrap();
                kv.pushpull(Vec::<i32>::new(), none(), none()).unwrap();
                kv.pushpull_in_place(Vec::<i32>::new(), none()).unwrap();
                kv.broadcast(Vec::<i32>::new(), none(), none()).unwrap();
                assert!(kv.pull_with(Vec::<i32>::new(), none(), PullOptions::default()).unwrap().is_complete());
                kv.init(&first, &NDArray::full(SHAPE, 2.0)).unwrap();
                assert_stored(&kv, &first, &SHAPE, 2.0, &format!("{ty}: first real call after empty ones"));
            }
            // on a store with keys and an updater: the updater is not called, values unchanged
            let kv = create(ty).unwrap();
            kv.init([3, 4], &[NDArray::full(SHAPE, 1.0), NDArray::full(SHAPE, 2.0)]).unwrap();
            let calls = Arc::new(Mutex::new(0usize));
            let c = Arc::clone(&calls);
            kv.set_updater(move |_k: &Key, input: &NDArray, stored: &mut NDArray| {
                *c.lock().unwrap() += 1;
                stored.add_assign(input)?;
                Ok(())
            });
            kv.push(Vec::<Key>::new(), none()).unwrap();
            kv.pushpull_in_place(Vec::<Key>::new(), none()).unwrap();
            kv.init(Vec::<Key>::new(), none()).unwrap();
            kv.wait_all().unwrap();
            assert_eq!(*calls.lock().unwrap(), 0, "{ty}: an empty push calls no updater");
            assert_stored(&kv, 3, &SHAPE, 1.0, ty);
            assert_stored(&kv, 4, &SHAPE, 2.0, ty);
            kv.push(3, &NDArray::ones(SHAPE)).unwrap();
            assert_stored(&kv, 3, &SHAPE, 2.0, &format!("{ty}: the updater still runs on a real push"));
            assert_eq!(*calls.lock().unwrap(), 1);
        }
    });
}

#[test]
fn keys_and_values_length_mismatch() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init([5, 7], &[NDArray::full(SHAPE, 1.0), NDArray::full(SHAPE, 1.0)]).unwrap();
            let a = NDArray::full(SHAPE, 3.0);
            let three = [NDArray::ones(SHAPE), NDArray::ones(SHAPE), NDArray::ones(SHAPE)];
            for (op, res, keys, values) in [
                ("init", kv.init([8, 9], vec![&a]), 2, 1),
                ("push", kv.push([5, 7], vec![&a]), 2, 1),
                ("push", kv.push([5, 7], &three), 2, 3),
                ("pull", kv.pull([5, 7], vec![&a]), 2, 1),
                ("pushpull", kv.pushpull([5, 7], &three, &three), 2, 3),
                ("broadcast", kv.broadcast([8, 9], vec![&a], vec![&a, &a]), 2, 1),
                // one key given two per-key lists
                ("push", kv.push(5, vec![vec![&a], vec![&a]]), 1, 2),
            ] {
                let e = store_err(res, &format!("{ty} {op}"));
                match &e {
                    StoreError::LengthMismatch { op: o, keys: k, values: v } => assert_eq!((*o, *k, *v), (op, keys, values)),
                    other => panic!("{ty} {op}: expected LengthMismatch, got {other:?}"),
                }
                assert_msg(&e, &[&format!("{keys} keys but {values} values"), "one value"]);
            }
            assert_all(&a, 3.0, &format!("{ty}: nothing written"));
            for k in [8, 9] {
                assert!(matches!(store_err(kv.pull(k, &a), ty), StoreError::NotInitialized { .. }), "{ty}: {k} not initialised");
            }
            assert_stored(&kv, 5, &SHAPE, 1.0, ty);
            assert_usable(&kv, 5, &SHAPE, ty);
            assert_usable(&kv, 7, &SHAPE, ty);
        }
    });
}

#[test]
fn empty_value_list_for_a_key() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::full(SHAPE, 1.0)).unwrap();
            for (op, res) in [
                ("push", kv.push(3, Vec::<&NDArray>::new())),
                ("pull", kv.pull(3, Vec::<&NDArray>::new())),
                ("push", kv.push([3], vec![Vec::<&NDArray>::new()])),
            ] {
                let e = store_err(res, &format!("{ty} {op}"));
                assert!(matches!(&e, StoreError::EmptyValueList { op: o, key } if *o == op && *key == Key::Int(3)), "{e:?}");
                assert_msg(&e, &["key 3", "empty list"]);
            }
            assert_stored(&kv, 3, &SHAPE, 1.0, ty);
            assert_usable(&kv, 3, &SHAPE, ty);
        }
    });
}

#[test]
fn unknown_store_type_lists_valid_names() {
    bounded(|| {
        for name in ["foo", "", "localx", "row_sparse"] {
            let e = store_err(create(name), &format!("create({name:?})"));
            assert!(matches!(&e, StoreError::UnknownStoreType { name: n, .. } if n == name), "{e:?}");
            assert_msg(&e, &[&format!("`{name}`"), "local", "device", "local_allreduce_cpu", "local_allreduce_device", "dist_sync"]);
        }
        // distributed names are known; outside a job (no DMLC_* variables, whatever the
        // caller's shell holds) creating one is a configuration error naming the missing variable
        outside_a_job();
        for name in ["dist_sync", "dist_async", "dist_device_sync", "dist"] {
            match create(name) {
                Err(synkv::Error::Dist(e @ synkv::ps::Error::Config(_))) => assert!(e.to_string().contains("DMLC_PS_ROOT_URI"), "{e}"),
                other => panic!("{name}: expected a configuration error, got {other:?}"),
            }
        }
        // every store type still works after the failed creations
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::zeros(SHAPE)).unwrap();
            assert_usable(&kv, 3, &SHAPE, ty);
        }
    });
}

// Documented difference 6: a row_sparse output skipped by a pull is reported, not silent.
#[test]
fn pull_into_row_sparse_output_is_reported_and_skipped() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::ones(SHAPE)).unwrap();
            let rs = NDArray::row_sparse(SHAPE, vec![0, 1], Buffer::from_vec(vec![2.0f32; 4]), Context::cpu(0)).unwrap();
            let dense = NDArray::zeros(SHAPE);
            let report = kv.pull_with(3, vec![&rs, &dense], PullOptions::default()).unwrap();
            assert_eq!(report.skipped_sparse, vec![Key::Int(3)]);
            assert!(!report.is_complete());
            assert_all(&rs, 2.0, &format!("{ty}: upstream T10(a): the row_sparse output keeps 2"));
            assert_all(&dense, 1.0, &format!("{ty}: the dense output is written"));
            kv.pull(3, &rs).unwrap();
            assert_all(&rs, 2.0, &format!("{ty}: plain pull skips too"));
            let report = kv.pull_with(3, &rs, PullOptions { priority: 0, ignore_sparse: false }).unwrap();
            assert!(report.is_complete());
            assert_all(&rs, 1.0, &format!("{ty}: ignore_sparse = false writes every row (K4.3)"));
            assert_eq!(rs.indices().unwrap(), vec![0, 1]);
        }
    });
}

// ---- asynchronous errors: a failing or panicking updater ----

/// `wait_all` reports the first error raised anywhere in the process since the last one, so the
/// tests that raise asynchronous errors take turns.
static ASYNC_ERRORS: Mutex<()> = Mutex::new(());

fn async_turn() -> MutexGuard<'static, ()> {
    ASYNC_ERRORS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Marks a pushed value as poison for [`poison_updater`].
const POISON: f64 = -1000.0;

#[derive(Debug)]
struct Boom;
impl Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("boom: the updater refused a poisoned gradient")
    }
}
impl std::error::Error for Boom {}

/// How the updater misbehaves on a poisoned input.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Misbehave {
    ReturnErr,
    Panic,
    ChangeShape,
}

/// `stored += input`, except on a poisoned input (first element = POISON), where it fails
/// before touching `stored`.
fn poison_updater(kv: &KVStore, how: Misbehave) {
    kv.set_updater(move |_key: &Key, input: &NDArray, stored: &mut NDArray| {
        let first = input.to_vec::<f64>()?[0];
        if first == POISON {
            match how {
                Misbehave::ReturnErr => return Err(Error::other(Boom)),
                Misbehave::Panic => panic!("updater panicked on purpose"),
                Misbehave::ChangeShape => {
                    *stored = NDArray::zeros([1]);
                    return Ok(());
                }
            }
        }
        stored.add_assign(input)?;
        Ok(())
    });
}

/// Checks that `err` is the updater failure of `how` for `key`, raised by the push operation.
#[track_caller]
fn assert_updater_failure(err: &engine::Error, how: Misbehave, key: &Key) {
    let engine::Error::Failed { op, source } = err else {
        panic!("expected engine::Error::Failed from the push operation, got {err:?}");
    };
    assert_eq!(*op, "push");
    let inner = source.downcast_ref::<Error>().unwrap_or_else(|| panic!("the source should be a synkv::Error: {source:?}"));
    match how {
        Misbehave::ReturnErr => {
            let Error::Store(StoreError::UpdaterFailed { key: k, source: user_err }) = inner else {
                panic!("expected StoreError::UpdaterFailed, got {inner:?}");
            };
            assert_eq!(k, key);
            let Error::Other(user) = &**user_err else { panic!("expected the user's error inside, got {user_err:?}") };
            assert!(user.downcast_ref::<Boom>().is_some(), "the user's own error type is kept: {user:?}");
            assert_msg(err, &["boom"]);
        }
        Misbehave::Panic => {
            assert!(
                matches!(inner, Error::Store(StoreError::UpdaterPanicked { key: k, message }) if k == key && message.contains("on purpose")),
                "{inner:?}"
            );
        }
        Misbehave::ChangeShape => {
            assert!(matches!(inner, Error::Store(StoreError::UpdaterChangedValue { key: k, .. }) if k == key), "{inner:?}");
            assert_msg(err, &["in place"]);
        }
    }
    // the message says which key's update failed
    assert_msg(err, &[&format!("key {key}")]);
}

const MISBEHAVIOURS: [Misbehave; 3] = [Misbehave::ReturnErr, Misbehave::Panic, Misbehave::ChangeShape];

#[test]
fn updater_failure_surfaces_on_the_pulled_output_and_the_store_keeps_working() {
    bounded(|| {
        let _turn = async_turn();
        for ty in STORE_TYPES {
            for how in MISBEHAVIOURS {
                let what = format!("{ty} {how:?}");
                let kv = create(ty).unwrap();
                let _ = kv.wait_all();
                let key = Key::Int(13);
                kv.init(&key, &NDArray::full(SHAPE, 5.0)).unwrap();
                poison_updater(&kv, how);
                kv.push(&key, &NDArray::full(SHAPE, POISON)).expect("the push itself is valid and accepted");
                let out = NDArray::zeros(SHAPE);
                kv.pull(&key, &out).unwrap();
                let err = match out.wait_to_read() {
                    Err(synkv::ndarray::Error::Engine(e)) => e,
                    other => panic!("{what}: the pulled output should report the updater failure, got {other:?}"),
                };
                assert_updater_failure(&err, how, &key);
                // reported once engine-wide as well
                let all = kv.wait_all().expect_err("wait_all reports the failure");
                assert!(matches!(all, Error::Engine(engine::Error::Failed { op: "push", .. })), "{what}: {all:?}");
                kv.wait_all().unwrap_or_else(|e| panic!("{what}: reported twice: {e}"));

                // the store keeps working, and the stored value was kept (5, not changed)
                kv.push(&key, &NDArray::ones(SHAPE)).unwrap();
                let out = NDArray::zeros(SHAPE);
                kv.pull(&key, &out).unwrap();
                assert_all(&out, 6.0, &format!("{what}: kept 5, then += 1"));
                kv.wait_all().unwrap();
            }
        }
    });
}

#[test]
fn updater_failure_surfaces_from_wait_all() {
    bounded(|| {
        let _turn = async_turn();
        for ty in STORE_TYPES {
            for how in MISBEHAVIOURS {
                let what = format!("{ty} {how:?}");
                let kv = create(ty).unwrap();
                let _ = kv.wait_all();
                kv.init("w", &NDArray::full(SHAPE, 5.0)).unwrap();
                poison_updater(&kv, how);
                kv.push("w", &NDArray::full(SHAPE, POISON)).unwrap();
                let err = match kv.wait_all() {
                    Err(Error::Engine(e)) => e,
                    other => panic!("{what}: wait_all should report the updater failure, got {other:?}"),
                };
                assert_updater_failure(&err, how, &Key::from("w"));
                kv.wait_all().unwrap_or_else(|e| panic!("{what}: reported twice: {e}"));
                kv.push("w", &per_device(&SHAPE, 2, 1.0)).unwrap();
                let out = NDArray::zeros(SHAPE);
                kv.pull("w", &out).unwrap();
                assert_all(&out, 7.0, &format!("{what}: kept 5, then += 2"));
                // without the updater the store assigns again
                kv.clear_updater();
                assert_usable(&kv, "w", &SHAPE, &what);
                kv.wait_all().unwrap();
            }
        }
    });
}

// Once the failure has been reported, the kept value can be read again without a new push.
#[test]
fn kept_value_is_readable_after_the_failure_was_reported() {
    bounded(|| {
        let _turn = async_turn();
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let _ = kv.wait_all();
            kv.init(3, &NDArray::full(SHAPE, 5.0)).unwrap();
            poison_updater(&kv, Misbehave::ReturnErr);
            kv.push(3, &NDArray::full(SHAPE, POISON)).unwrap();
            let out = NDArray::zeros(SHAPE);
            kv.pull(3, &out).unwrap();
            assert!(out.wait_to_read().is_err(), "{ty}: first pull reports the failure");
            let _ = kv.wait_all();
            let again = NDArray::zeros(SHAPE);
            kv.pull(3, &again).unwrap();
            match again.to_vec::<f32>() {
                Ok(v) => assert_eq!(v, vec![5.0; 4], "{ty}: the kept value"),
                Err(e) => panic!("{ty}: a second pull, after the failure was reported, fails again: {e}"),
            }
            kv.wait_all().unwrap();
        }
    });
}

// One key's failing update does not decide whether the other keys of the same push are updated.
#[test]
fn a_failing_key_does_not_block_the_other_keys_of_the_push() {
    bounded(|| {
        let _turn = async_turn();
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let _ = kv.wait_all();
            let keys = [5, 13, 20];
            kv.init(keys, &[NDArray::full(SHAPE, 1.0), NDArray::full(SHAPE, 1.0), NDArray::full(SHAPE, 1.0)]).unwrap();
            poison_updater(&kv, Misbehave::ReturnErr);
            let good = NDArray::full(SHAPE, 10.0);
            let poison = NDArray::full(SHAPE, POISON);
            kv.push(keys, vec![&good, &poison, &good]).unwrap();
            assert!(kv.wait_all().is_err(), "{ty}: the failure is reported");
            let ones = NDArray::ones(SHAPE);
            kv.push(keys, vec![&ones, &ones, &ones]).unwrap();
            let o = [NDArray::zeros(SHAPE), NDArray::zeros(SHAPE), NDArray::zeros(SHAPE)];
            kv.pull(keys, &o).unwrap();
            let got: Vec<f64> = o.iter().map(|a| a.to_vec::<f64>().unwrap()[0]).collect();
            assert_eq!(got, vec![12.0, 2.0, 12.0], "{ty}: keys 5 and 20 got both updates, key 13 kept its value and got the second");
            kv.wait_all().unwrap();
        }
    });
}

// With several keys in one push, the error names the key whose update failed.
#[test]
fn an_updater_error_names_the_failing_key_among_several() {
    bounded(|| {
        let _turn = async_turn();
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let _ = kv.wait_all();
            kv.init([3, 13, 20], &[NDArray::full(SHAPE, 5.0), NDArray::full(SHAPE, 5.0), NDArray::full(SHAPE, 5.0)]).unwrap();
            poison_updater(&kv, Misbehave::ReturnErr);
            let (one, poison) = (NDArray::ones(SHAPE), NDArray::full(SHAPE, POISON));
            kv.push([3, 13, 20], vec![&one, &poison, &one]).unwrap();
            let err = match kv.wait_all() {
                Err(Error::Engine(e)) => e,
                other => panic!("{ty}: wait_all should report the updater failure, got {other:?}"),
            };
            assert_updater_failure(&err, Misbehave::ReturnErr, &Key::Int(13));
            assert!(!err.to_string().contains("key 3 ") && !err.to_string().contains("key 20"), "{ty}: only the failing key: {err}");
            kv.wait_all().unwrap();
        }
    });
}

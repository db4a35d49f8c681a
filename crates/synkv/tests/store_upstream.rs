//! The upstream KVStore test inventory (spec K11) for the in-process stores, dense parts, with
//! upstream's exact numbers. Every case runs on `local` and `device`, and with int keys (3 and
//! `[5, 7, 11]`) and str keys (`a` and `[b, c, d]`) where upstream does.

mod common;

use std::sync::{Arc, Mutex};

use common::{assert_all, assert_close, assert_f32, bounded, per_device, zeros_per_device, STORE_TYPES};
use synkv::store::{Error as StoreError, KeyKind, StoreType};
use synkv::{create, Context, Error, KVStore, Key, NDArray};

/// Upstream's default shape.
const SHAPE: [usize; 2] = [4, 4];

/// One key kind's keys: a single key, and a list.
#[derive(Clone)]
struct KeySet {
    single: Key,
    list: Vec<Key>,
    /// A second single key (upstream's 6 / 'aa').
    other: Key,
    /// A second list (upstream's 10, 14, 22 / 'bb', 'cc', 'dd').
    other_list: Vec<Key>,
}

fn int_keys() -> KeySet {
    KeySet {
        single: Key::Int(3),
        list: vec![Key::Int(5), Key::Int(7), Key::Int(11)],
        other: Key::Int(6),
        other_list: vec![Key::Int(10), Key::Int(14), Key::Int(22)],
    }
}

fn str_keys() -> KeySet {
    KeySet {
        single: Key::from("a"),
        list: vec![Key::from("b"), Key::from("c"), Key::from("d")],
        other: Key::from("aa"),
        other_list: vec![Key::from("bb"), Key::from("cc"), Key::from("dd")],
    }
}

fn key_sets() -> [KeySet; 2] {
    [int_keys(), str_keys()]
}

/// Upstream's `init_kv`: the single key and the list initialised with zeros.
fn init_kv(ty: &str, ks: &KeySet) -> KVStore {
    let kv = create(ty).unwrap();
    kv.init(&ks.single, &NDArray::zeros(SHAPE)).unwrap();
    let zeros: Vec<NDArray> = ks.list.iter().map(|_| NDArray::zeros(SHAPE)).collect();
    kv.init(&ks.list, &zeros).unwrap();
    kv
}

fn outs(n: usize) -> Vec<NDArray> {
    (0..n).map(|_| NDArray::zeros(SHAPE)).collect()
}

/// Runs `case` for every store type and key kind.
fn each(case: fn(&str, &KeySet)) {
    bounded(move || {
        for ty in STORE_TYPES {
            for ks in key_sets() {
                case(ty, &ks);
            }
        }
    });
}

// T1 test_single_kv_pair (dense): push ones → pull 1.
#[test]
fn t1_single_kv_pair() {
    each(|ty, ks| {
        let kv = init_kv(ty, ks);
        kv.push(&ks.single, &NDArray::ones(SHAPE)).unwrap();
        let out = NDArray::zeros(SHAPE);
        kv.pull(&ks.single, &out).unwrap();
        assert_all(&out, 1.0, &format!("T1 {ty} key {}", ks.single));
    });
}

// T3 test_init: a fresh store, init with ones·4 → pull 4.
#[test]
fn t3_init() {
    each(|ty, ks| {
        let kv = create(ty).unwrap();
        kv.init(&ks.single, &NDArray::full(SHAPE, 4.0)).unwrap();
        let out = NDArray::zeros(SHAPE);
        kv.pull(&ks.single, &out).unwrap();
        assert_all(&out, 4.0, &format!("T3 {ty} key {}", ks.single));
    });
}

// T4 test_pull: init '1' zeros, push the same ones array four times → 4; a key initialised
// after pushes ('2', zeros) pulls 0 (the upstream regression, K2.3).
#[test]
fn t4_pull_and_late_init() {
    bounded(|| {
        for ty in STORE_TYPES {
            for (k1, k2) in [(Key::from("1"), Key::from("2")), (Key::Int(1), Key::Int(2))] {
                let kv = create(ty).unwrap();
                kv.init(&k1, &NDArray::zeros(SHAPE)).unwrap();
                let a = NDArray::ones(SHAPE);
                kv.push(&k1, vec![&a, &a, &a, &a]).unwrap();
                let out = NDArray::zeros(SHAPE);
                kv.pull(&k1, &out).unwrap();
                assert_all(&out, 4.0, &format!("T4 {ty} key {k1} after pushing one array four times"));
                kv.init(&k2, &NDArray::zeros(SHAPE)).unwrap();
                let out2 = NDArray::ones(SHAPE);
                kv.pull(&k2, &out2).unwrap();
                assert_all(&out2, 0.0, &format!("T4 {ty} key {k2} initialised after pushes"));
                // the first key is untouched by the late init
                kv.pull(&k1, &out).unwrap();
                assert_all(&out, 4.0, &format!("T4 {ty} key {k1} after the late init"));
            }
        }
    });
}

// T5 test_list_kv_pair (dense): list keys, each pushed ones·4 → each pulls 4.
#[test]
fn t5_list_kv_pair() {
    each(|ty, ks| {
        let kv = init_kv(ty, ks);
        let vals: Vec<NDArray> = ks.list.iter().map(|_| NDArray::full(SHAPE, 4.0)).collect();
        kv.push(&ks.list, &vals).unwrap();
        let o = outs(ks.list.len());
        kv.pull(&ks.list, &o).unwrap();
        for (k, out) in ks.list.iter().zip(&o) {
            assert_all(out, 4.0, &format!("T5 {ty} key {k}"));
        }
    });
}

// T5 as upstream literally writes it: `[empty(shape)] * len(keys)` is one output array three
// times, so one pull writes the same array for every key.
#[test]
fn t5_list_pull_into_one_shared_output() {
    each(|ty, ks| {
        let kv = init_kv(ty, ks);
        let four = NDArray::full(SHAPE, 4.0);
        let vals: Vec<&NDArray> = ks.list.iter().map(|_| &four).collect();
        kv.push(&ks.list, vals).unwrap();
        let shared = NDArray::zeros(SHAPE);
        let o: Vec<&NDArray> = ks.list.iter().map(|_| &shared).collect();
        kv.pull(&ks.list, o).unwrap();
        assert_all(&shared, 4.0, &format!("T5 {ty} shared output"));
    });
}

// T6 test_aggregator (skipped upstream: MXNet segfaults, #18098; synkv must pass): 4 CPU
// contexts × ones → 4 on every output; list keys with 2.0 per device → 8.
#[test]
fn t6_aggregator() {
    each(|ty, ks| {
        let kv = init_kv(ty, ks);
        let n = 4;
        let vals = per_device(&SHAPE, n, 1.0);
        kv.push(&ks.single, &vals).unwrap();
        let o = zeros_per_device(&SHAPE, n);
        kv.pull(&ks.single, &o).unwrap();
        for (d, out) in o.iter().enumerate() {
            assert_eq!(out.context(), Context::cpu(d));
            assert_all(out, 4.0, &format!("T6 {ty} key {} output on cpu({d})", ks.single));
        }

        let vals: Vec<Vec<NDArray>> = ks.list.iter().map(|_| per_device(&SHAPE, n, 2.0)).collect();
        kv.push(&ks.list, &vals).unwrap();
        let o: Vec<Vec<NDArray>> = ks.list.iter().map(|_| zeros_per_device(&SHAPE, n)).collect();
        kv.pull(&ks.list, &o).unwrap();
        for (k, per_key) in ks.list.iter().zip(&o) {
            for (d, out) in per_key.iter().enumerate() {
                assert_all(out, 8.0, &format!("T6 {ty} list key {k} output on cpu({d})"));
            }
        }
    });
}

/// An updater `stored += input`, recording the keys it was called with.
fn recording_add(kv: &KVStore, scale: f64) -> Arc<Mutex<Vec<Key>>> {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let rec = Arc::clone(&calls);
    kv.set_updater(move |key: &Key, input: &NDArray, stored: &mut NDArray| {
        rec.lock().unwrap().push(key.clone());
        if scale == 1.0 {
            stored.add_assign(input)?;
        } else {
            stored.add_assign(&(input * scale)?)?;
        }
        Ok(())
    });
    calls
}

fn take(calls: &Mutex<Vec<Key>>) -> Vec<Key> {
    std::mem::take(&mut *calls.lock().unwrap())
}

// T8 test_updater (dense): `stored += input`; 4 devices × ones on the single key → 4; the list
// pushed 4 times from 4 devices → 16. The updater receives Key::Int for int keys and Key::Str
// for str keys, once per key per push, in ascending (int) or init (str) order.
#[test]
fn t8_updater() {
    each(|ty, ks| {
        let kv = init_kv(ty, ks);
        let calls = recording_add(&kv, 1.0);
        let n = 4;
        let vals = per_device(&SHAPE, n, 1.0);
        kv.push(&ks.single, &vals).unwrap();
        let o = zeros_per_device(&SHAPE, n);
        kv.pull(&ks.single, &o).unwrap();
        for out in &o {
            assert_all(out, 4.0, &format!("T8 {ty} key {}", ks.single));
        }
        assert_eq!(take(&calls), vec![ks.single.clone()], "T8 {ty}: one updater call with the key itself");

        let vals: Vec<Vec<NDArray>> = ks.list.iter().map(|_| per_device(&SHAPE, n, 1.0)).collect();
        for _ in 0..4 {
            kv.push(&ks.list, &vals).unwrap();
        }
        let o: Vec<Vec<NDArray>> = ks.list.iter().map(|_| zeros_per_device(&SHAPE, n)).collect();
        kv.pull(&ks.list, &o).unwrap();
        for (k, per_key) in ks.list.iter().zip(&o) {
            for out in per_key {
                assert_all(out, 16.0, &format!("T8 {ty} list key {k}"));
            }
        }
        let recorded = take(&calls);
        let expected: Vec<Key> = (0..4).flat_map(|_| ks.list.iter().cloned()).collect();
        assert_eq!(recorded, expected, "T8 {ty}: one call per key per push, in key order");
        let kind = ks.single.kind();
        assert!(recorded.iter().all(|k| k.kind() == kind), "T8 {ty}: keys reach the updater as {kind}");
    });
}

// T9 test_get_type: the type name round-trips (lower-cased).
#[test]
fn t9_get_type() {
    bounded(|| {
        let kv = create("local_allreduce_cpu").unwrap();
        assert_eq!(kv.type_name(), "local_allreduce_cpu");
        assert_eq!(kv.store_type(), StoreType::Local);
        let kv = create("Local_AllReduce_Device").unwrap();
        assert_eq!(kv.type_name(), "local_allreduce_device");
        assert_eq!(kv.store_type(), StoreType::Device);
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            assert_eq!(kv.type_name(), ty);
            assert_eq!((kv.rank(), kv.num_workers()), (0, 1));
        }
    });
}

fn expect_mixed(res: synkv::Result<()>, op: &str, store: KeyKind, got: KeyKind, what: &str) {
    match res {
        Err(Error::Store(StoreError::MixedKeyKinds { op: o, store: s, got: g, .. })) => {
            assert_eq!((o, s, g), (op, store, got), "{what}");
        }
        other => panic!("{what}: expected MixedKeyKinds, got {other:?}"),
    }
}

// T10(c) test_invalid_pull: the wrong key kind for init/push/pull is an error.
#[test]
fn t10_wrong_key_kind() {
    bounded(|| {
        for ty in STORE_TYPES {
            for (ks, wrong) in [(int_keys(), Key::from("x")), (str_keys(), Key::Int(99))] {
                let kv = init_kv(ty, &ks);
                let (store, got) = (ks.single.kind(), wrong.kind());
                let a = NDArray::ones(SHAPE);
                expect_mixed(kv.init(&wrong, &a), "init", store, got, &format!("T10 {ty} init {wrong}"));
                expect_mixed(kv.push(&wrong, &a), "push", store, got, &format!("T10 {ty} push {wrong}"));
                expect_mixed(kv.pull(&wrong, &a), "pull", store, got, &format!("T10 {ty} pull {wrong}"));
                // still usable
                kv.push(&ks.single, &NDArray::full(SHAPE, 2.0)).unwrap();
                let out = NDArray::zeros(SHAPE);
                kv.pull(&ks.single, &out).unwrap();
                assert_all(&out, 2.0, &format!("T10 {ty} after the errors"));
            }
        }
    });
}

// T11 test_broadcast_single_kv_pair: broadcast(3/'a', ones, out) → 1; broadcast(6/'aa', ones,
// 3 outs) → 1.
#[test]
fn t11_broadcast_single() {
    each(|ty, ks| {
        let kv = create(ty).unwrap();
        let out = NDArray::zeros(SHAPE);
        kv.broadcast(&ks.single, &NDArray::ones(SHAPE), &out).unwrap();
        assert_all(&out, 1.0, &format!("T11 {ty} key {}", ks.single));
        let o = outs(3);
        kv.broadcast(&ks.other, &NDArray::ones(SHAPE), &o).unwrap();
        for out in &o {
            assert_all(out, 1.0, &format!("T11 {ty} key {} (3 outputs)", ks.other));
        }
        // broadcast initialised the keys: a pull reads the broadcast value
        let again = NDArray::zeros(SHAPE);
        kv.pull(&ks.other, &again).unwrap();
        assert_all(&again, 1.0, &format!("T11 {ty} pull after broadcast"));
    });
}

// T12 test_broadcast_list_kv_pair: a key list → 1 each; a second list with 2 outputs per key → 1.
#[test]
fn t12_broadcast_list() {
    each(|ty, ks| {
        let kv = create(ty).unwrap();
        let ones: Vec<NDArray> = ks.list.iter().map(|_| NDArray::ones(SHAPE)).collect();
        let o = outs(ks.list.len());
        kv.broadcast(&ks.list, &ones, &o).unwrap();
        for (k, out) in ks.list.iter().zip(&o) {
            assert_all(out, 1.0, &format!("T12 {ty} key {k}"));
        }
        let ones: Vec<NDArray> = ks.other_list.iter().map(|_| NDArray::ones(SHAPE)).collect();
        let o: Vec<Vec<NDArray>> = ks.other_list.iter().map(|_| outs(2)).collect();
        kv.broadcast(&ks.other_list, &ones, &o).unwrap();
        for (k, per_key) in ks.other_list.iter().zip(&o) {
            for out in per_key {
                assert_all(out, 1.0, &format!("T12 {ty} key {k} (2 outputs)"));
            }
        }
    });
}

// T13 test_pushpull_single_kv_pair: broadcast zeros first; 4 CPU contexts × ones: pushpull →
// outputs 4; in place → values 4; key lists with 2.0 → 8, in place 8.
#[test]
fn t13_pushpull() {
    each(|ty, ks| {
        let kv = create(ty).unwrap();
        let n = 4;
        kv.broadcast(&ks.single, &NDArray::zeros(SHAPE), &NDArray::ones(SHAPE)).unwrap();
        let vals = per_device(&SHAPE, n, 1.0);
        let o = zeros_per_device(&SHAPE, n);
        kv.pushpull(&ks.single, &vals, &o).unwrap();
        for out in &o {
            assert_all(out, 4.0, &format!("T13 {ty} key {} outputs", ks.single));
        }
        for v in &vals {
            assert_all(v, 1.0, &format!("T13 {ty}: pushpull with outputs leaves the values alone"));
        }
        kv.pushpull_in_place(&ks.single, &vals).unwrap();
        for v in &vals {
            assert_all(v, 4.0, &format!("T13 {ty} key {} in place", ks.single));
        }

        let zeros: Vec<NDArray> = ks.list.iter().map(|_| NDArray::zeros(SHAPE)).collect();
        let bo = outs(ks.list.len());
        kv.broadcast(&ks.list, &zeros, &bo).unwrap();
        let vals: Vec<Vec<NDArray>> = ks.list.iter().map(|_| per_device(&SHAPE, n, 2.0)).collect();
        let o: Vec<Vec<NDArray>> = ks.list.iter().map(|_| zeros_per_device(&SHAPE, n)).collect();
        kv.pushpull(&ks.list, &vals, &o).unwrap();
        for (k, per_key) in ks.list.iter().zip(&o) {
            for out in per_key {
                assert_all(out, 8.0, &format!("T13 {ty} list key {k}"));
            }
        }
        kv.pushpull_in_place(&ks.list, &vals).unwrap();
        for (k, per_key) in ks.list.iter().zip(&vals) {
            for v in per_key {
                assert_all(v, 8.0, &format!("T13 {ty} list key {k} in place"));
            }
        }
    });
}

// T14 test_pushpull_list_kv_pair: key lists, one value per key and 4 per key, with outputs.
#[test]
fn t14_pushpull_list() {
    each(|ty, ks| {
        let kv = create(ty).unwrap();
        let zeros: Vec<NDArray> = ks.list.iter().map(|_| NDArray::zeros(SHAPE)).collect();
        kv.broadcast(&ks.list, &zeros, &outs(ks.list.len())).unwrap();
        let vals: Vec<NDArray> = ks.list.iter().map(|_| NDArray::full(SHAPE, 2.0)).collect();
        let o = outs(ks.list.len());
        kv.pushpull(&ks.list, &vals, &o).unwrap();
        for (k, out) in ks.list.iter().zip(&o) {
            assert_all(out, 2.0, &format!("T14 {ty} key {k}"));
        }
        let vals: Vec<Vec<NDArray>> = ks.list.iter().map(|_| per_device(&SHAPE, 4, 2.0)).collect();
        let o: Vec<Vec<NDArray>> = ks.list.iter().map(|_| zeros_per_device(&SHAPE, 4)).collect();
        kv.pushpull(&ks.list, &vals, &o).unwrap();
        for (k, per_key) in ks.list.iter().zip(&o) {
            for out in per_key {
                assert_all(out, 8.0, &format!("T14 {ty} key {k} (4 devices)"));
            }
        }
    });
}

// T37 cpp-package example: init/pull round trip; push assigns; a key repeated in one push is
// summed (K3.2).
#[test]
fn t37_cpp_example() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let init = [0.0f32, 233.0, -0.12, 9.0];
            kv.init(3, &NDArray::from_slice([4], &init).unwrap()).unwrap();
            let out = NDArray::zeros([4]);
            kv.pull(3, &out).unwrap();
            assert_f32(&out, &init, &format!("T37 {ty} init round trip"));

            let grad = [0.1f32, -2.0, -4.4, 0.0];
            kv.push(3, &NDArray::from_slice([4], &grad).unwrap()).unwrap();
            kv.pull(3, &out).unwrap();
            assert_f32(&out, &grad, &format!("T37 {ty} push assigns"));

            kv.init(4, &NDArray::zeros([4])).unwrap();
            let g0 = NDArray::from_slice([4], &[1.0f32, -1.0, 0.5, 7.0]).unwrap();
            let g1 = NDArray::from_slice([4], &[2.0f32, 4.0, -4.0, -5.0]).unwrap();
            let g2 = NDArray::from_slice([4], &[-3.0f32, -0.2, 12.0, -9.0]).unwrap();
            kv.push([3, 4, 4], vec![&g0, &g1, &g2]).unwrap();
            let o3 = NDArray::zeros([4]);
            let o4 = NDArray::zeros([4]);
            kv.pull([3, 4], vec![&o3, &o4]).unwrap();
            assert_f32(&o3, &[1.0, -1.0, 0.5, 7.0], &format!("T37 {ty} k0 = g0"));
            assert_close(&o4, &[-1.0, 3.8, 8.0, -14.0], 1e-6, &format!("T37 {ty} k1 = g1 + g2"));
        }
    });
}

// T38 Python tutorial (K6.4): 2 → 8 → 4; updater `stored += input*2`: push ones → 6; keys
// 5, 7, 9 initialised with ones, push ones → 3; push 4 devices × ones → 3 + 2·4 = 11.
#[test]
fn t38_python_tutorial() {
    bounded(|| {
        for ty in STORE_TYPES {
            let shape = [2, 3];
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::full(shape, 2.0)).unwrap();
            let a = NDArray::zeros(shape);
            kv.pull(3, &a).unwrap();
            assert_all(&a, 2.0, &format!("T38 {ty} init"));
            kv.push(3, &NDArray::full(shape, 8.0)).unwrap();
            kv.pull(3, &a).unwrap();
            assert_all(&a, 8.0, &format!("T38 {ty} push"));
            kv.push(3, &per_device(&shape, 4, 1.0)).unwrap();
            let b = zeros_per_device(&shape, 4);
            kv.pull(3, &b).unwrap();
            for out in &b {
                assert_all(out, 4.0, &format!("T38 {ty} 4-device push"));
            }

            let calls = recording_add(&kv, 2.0);
            kv.push(3, &NDArray::ones(shape)).unwrap();
            kv.pull(3, &a).unwrap();
            assert_all(&a, 6.0, &format!("T38 {ty} updater ×2"));
            assert_eq!(take(&calls), vec![Key::Int(3)]);

            let keys = [5, 7, 9];
            let ones: Vec<NDArray> = keys.iter().map(|_| NDArray::ones(shape)).collect();
            kv.init(keys, &ones).unwrap();
            kv.push(keys, &ones).unwrap();
            let b: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros(shape)).collect();
            kv.pull(keys, &b).unwrap();
            for out in &b {
                assert_all(out, 3.0, &format!("T38 {ty} keys 5,7,9"));
            }
            assert_eq!(take(&calls), vec![Key::Int(5), Key::Int(7), Key::Int(9)], "T38 {ty}: update on key 5/7/9");

            let b: Vec<Vec<NDArray>> = keys.iter().map(|_| per_device(&shape, 4, 1.0)).collect();
            kv.push(keys, &b).unwrap();
            kv.pull(keys, &b).unwrap();
            for per_key in &b {
                for out in per_key {
                    assert_all(out, 11.0, &format!("T38 {ty} 4 devices"));
                }
            }
            assert_eq!(take(&calls), vec![Key::Int(5), Key::Int(7), Key::Int(9)]);
        }
    });
}

// K10.4 Perl tutorial: 2, 8, 2 (two devices), updater `stored += input*3` → 8, pulled to two
// outputs → 8; keys [5, 7, 9] → 4. The updater runs once per key, in ascending key order.
#[test]
fn perl_tutorial() {
    bounded(|| {
        for ty in STORE_TYPES {
            let shape = [2, 3];
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::full(shape, 2.0)).unwrap();
            let a = NDArray::zeros(shape);
            kv.pull(3, &a).unwrap();
            assert_all(&a, 2.0, &format!("Perl {ty} init"));
            kv.push(3, &NDArray::full(shape, 8.0)).unwrap();
            kv.pull(3, &a).unwrap();
            assert_all(&a, 8.0, &format!("Perl {ty} push"));
            let b = [NDArray::ones_on(shape, Context::cpu(0)), NDArray::ones_on(shape, Context::cpu(1))];
            kv.push(3, &b).unwrap();
            kv.pull(3, &a).unwrap();
            assert_all(&a, 2.0, &format!("Perl {ty} two devices"));

            let calls = recording_add(&kv, 3.0);
            kv.push(3, &b).unwrap();
            kv.pull(3, &a).unwrap();
            assert_all(&a, 8.0, &format!("Perl {ty} updater ×3"));
            let o = [NDArray::zeros_on(shape, Context::cpu(0)), NDArray::zeros_on(shape, Context::cpu(1))];
            kv.pull(3, &o).unwrap();
            for out in &o {
                assert_all(out, 8.0, &format!("Perl {ty} pull to two outputs"));
            }
            assert_eq!(take(&calls), vec![Key::Int(3)]);

            let keys = [5, 7, 9];
            let ones: Vec<NDArray> = keys.iter().map(|_| NDArray::ones(shape)).collect();
            kv.init(keys, &ones).unwrap();
            // pushed out of order: the updater still runs 5, 7, 9 (K3.3)
            kv.push([9, 5, 7], &ones).unwrap();
            let o: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros(shape)).collect();
            kv.pull(keys, &o).unwrap();
            for out in &o {
                assert_all(out, 4.0, &format!("Perl {ty} keys 5,7,9"));
            }
            assert_eq!(take(&calls), vec![Key::Int(5), Key::Int(7), Key::Int(9)], "Perl {ty}: ascending key order");
        }
    });
}

// K3.3 / K1.4: str keys reach the updater in init order, whatever order they are pushed in;
// int keys in ascending order.
#[test]
fn updater_order_int_ascending_str_init_order() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            for k in ["c", "a", "b"] {
                kv.init(k, &NDArray::zeros([2])).unwrap();
            }
            let calls = recording_add(&kv, 1.0);
            let ones = [NDArray::ones([2]), NDArray::ones([2]), NDArray::ones([2])];
            kv.push(["a", "b", "c"], &ones).unwrap();
            kv.push(["b", "c", "a"], &ones).unwrap();
            let o = [NDArray::zeros([2]), NDArray::zeros([2]), NDArray::zeros([2])];
            kv.pull(["a", "b", "c"], &o).unwrap();
            for out in &o {
                assert_all(out, 2.0, &format!("{ty} str keys"));
            }
            let c_a_b = vec![Key::from("c"), Key::from("a"), Key::from("b")];
            assert_eq!(take(&calls), [c_a_b.clone(), c_a_b].concat(), "{ty}: init order c, a, b for each push");

            let kv = create(ty).unwrap();
            let keys = [40, -3, 7, 12, 0];
            let zeros: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros([2])).collect();
            kv.init(keys, &zeros).unwrap();
            let calls = recording_add(&kv, 1.0);
            kv.push(keys, &zeros).unwrap();
            kv.wait_all().unwrap();
            assert_eq!(take(&calls), [-3, 0, 7, 12, 40].map(Key::Int).to_vec(), "{ty}: ascending int keys");
        }
    });
}

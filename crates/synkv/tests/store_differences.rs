//! synkv's deliberate improvements over MXNet (docs/mxnet-differences.md): arrays given to the
//! store are copied, never aliased (K12.1); the number of devices pushing a key may change
//! between pushes (K12.18); a pull into an output of another dtype converts.

mod common;

use std::sync::{Arc, Mutex};

use common::{assert_all, assert_f32, bounded, per_device, zeros_per_device, STORE_TYPES};
use synkv::store::{Error as StoreError, PullOptions};
use synkv::{create, Context, DType, Error, Key, NDArray};

const SHAPE: [usize; 2] = [3, 2];

// K12.1: MXNet makes the stored value *be* a single-device pushed array. synkv copies.
#[test]
fn a_pushed_array_is_copied_not_aliased() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::zeros(SHAPE)).unwrap();

            // mutate after an explicit wait
            let a = NDArray::full(SHAPE, 2.0);
            kv.push(3, &a).unwrap();
            kv.wait_all().unwrap();
            a.fill(9.0).unwrap();
            let out = NDArray::zeros(SHAPE);
            kv.pull(3, &out).unwrap();
            assert_all(&out, 2.0, &format!("{ty}: the store keeps the pushed value, not the mutated array"));

            // mutate at once, with no wait: the in-place write is ordered after the push's read
            let b = NDArray::full(SHAPE, 4.0);
            kv.push(3, &b).unwrap();
            b.fill(-1.0).unwrap();
            b.add_assign_scalar(100.0).unwrap();
            kv.pull(3, &out).unwrap();
            assert_all(&out, 4.0, &format!("{ty}: mutation right after push"));
            assert_all(&b, 99.0, &format!("{ty}: the caller's array has the caller's values"));

            // MXNet's dist nightly complaint: a later pull overwrites the pushed gradient
            let g = NDArray::full(SHAPE, 3.0);
            kv.push(3, &g).unwrap();
            kv.pull(3, &NDArray::zeros(SHAPE)).unwrap();
            kv.push(3, &NDArray::full(SHAPE, 8.0)).unwrap();
            let other = NDArray::zeros(SHAPE);
            kv.pull(3, &other).unwrap();
            assert_all(&other, 8.0, ty);
            assert_all(&g, 3.0, &format!("{ty}: pulls never write the pushed array"));

            // multi-device values, mutated after the push
            let vals = per_device(&SHAPE, 3, 1.0);
            kv.push(3, &vals).unwrap();
            for v in &vals {
                v.fill(50.0).unwrap();
            }
            kv.pull(3, &out).unwrap();
            assert_all(&out, 3.0, &format!("{ty}: multi-device push"));

            // pushpull in place: the arrays that received the value are not the store's either
            kv.pushpull_in_place(3, &vals).unwrap();
            for v in &vals {
                assert_all(v, 150.0, &format!("{ty}: pushpull in place"));
                v.fill(0.5).unwrap();
            }
            kv.pull(3, &out).unwrap();
            assert_all(&out, 150.0, &format!("{ty}: after mutating the pushpull arrays"));
        }
    });
}

#[test]
fn a_pushed_array_is_not_aliased_with_an_updater_either() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::zeros(SHAPE)).unwrap();
            kv.set_updater(|_k: &Key, input: &NDArray, stored: &mut NDArray| {
                stored.add_assign(input)?;
                Ok(())
            });
            let a = NDArray::full(SHAPE, 2.0);
            kv.push(3, &a).unwrap();
            a.fill(9.0).unwrap();
            kv.push(3, &a).unwrap();
            let out = NDArray::zeros(SHAPE);
            kv.pull(3, &out).unwrap();
            assert_all(&out, 11.0, &format!("{ty}: 0 + 2 + 9"));
            assert_all(&a, 9.0, ty);
        }
    });
}

#[test]
fn init_copies_its_value() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let a = NDArray::full(SHAPE, 2.0);
            let list = [NDArray::full(SHAPE, 5.0), NDArray::full(SHAPE, 7.0)];
            kv.init(3, &a).unwrap();
            kv.init([5, 7], &list).unwrap();
            a.fill(9.0).unwrap();
            for v in &list {
                v.mul_assign_scalar(10.0).unwrap();
            }
            let out = NDArray::zeros(SHAPE);
            kv.pull(3, &out).unwrap();
            assert_all(&out, 2.0, &format!("{ty}: init value mutated afterwards"));
            let outs = [NDArray::zeros(SHAPE), NDArray::zeros(SHAPE)];
            kv.pull([5, 7], &outs).unwrap();
            assert_all(&outs[0], 5.0, ty);
            assert_all(&outs[1], 7.0, ty);

            // broadcast copies too, and its outputs are independent of the store
            let v = NDArray::full(SHAPE, 4.0);
            let bo = NDArray::zeros(SHAPE);
            kv.broadcast(9, &v, &bo).unwrap();
            v.fill(-4.0).unwrap();
            bo.fill(-8.0).unwrap();
            kv.pull(9, &out).unwrap();
            assert_all(&out, 4.0, &format!("{ty}: broadcast value and output mutated afterwards"));
        }
    });
}

#[test]
fn a_pulled_output_is_a_copy() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::full(SHAPE, 2.0)).unwrap();
            let outs = zeros_per_device(&SHAPE, 2);
            kv.pull(3, &outs).unwrap();
            outs[0].fill(9.0).unwrap();
            assert_all(&outs[1], 2.0, &format!("{ty}: outputs are independent of each other"));
            let again = NDArray::zeros(SHAPE);
            kv.pull(3, &again).unwrap();
            assert_all(&again, 2.0, &format!("{ty}: mutating an output does not change the store"));
        }
    });
}

// K12.18: MXNet sizes its per-key copy buffers at the first multi-device push and indexes past
// them when more devices push later. synkv takes any number of values per push.
#[test]
fn the_number_of_devices_may_change_between_pushes() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::zeros(SHAPE)).unwrap();
            for n in [2, 4, 1, 8, 3] {
                kv.push(3, &per_device(&SHAPE, n, 1.0)).unwrap();
                let outs = zeros_per_device(&SHAPE, n);
                kv.pull(3, &outs).unwrap();
                for (d, out) in outs.iter().enumerate() {
                    assert_all(out, n as f64, &format!("{ty}: {n} devices, output on cpu({d})"));
                }
            }
            // in one list call, different keys may have different device counts
            kv.init([5, 7], &[NDArray::zeros(SHAPE), NDArray::zeros(SHAPE)]).unwrap();
            let vals = vec![per_device(&SHAPE, 1, 1.0), per_device(&SHAPE, 4, 1.0)];
            kv.push([5, 7], &vals).unwrap();
            let outs = vec![zeros_per_device(&SHAPE, 3), zeros_per_device(&SHAPE, 1)];
            kv.pull([5, 7], &outs).unwrap();
            outs[0].iter().for_each(|o| assert_all(o, 1.0, &format!("{ty}: key 5")));
            assert_all(&outs[1][0], 4.0, &format!("{ty}: key 7"));

            // and with an updater: stored += Σ
            kv.set_updater(|_k: &Key, input: &NDArray, stored: &mut NDArray| {
                stored.add_assign(input)?;
                Ok(())
            });
            let mut expected = 3.0;
            for n in [1, 4, 2] {
                kv.push(3, &per_device(&SHAPE, n, 1.0)).unwrap();
                expected += n as f64;
                let out = NDArray::zeros(SHAPE);
                kv.pull(3, &out).unwrap();
                assert_all(&out, expected, &format!("{ty}: updater, {n} devices"));
            }
        }
    });
}

// A pull into an output of another dtype is a converting copy (kept from MXNet); push requires
// the key's dtype exactly.
#[test]
fn pull_into_another_dtype_converts() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let vals = [0.1f32, 1.5, -2.25, 300000.0, 1.0 / 3.0, -0.0];
            kv.init(3, &NDArray::from_slice(SHAPE, &vals).unwrap()).unwrap();

            let o64 = NDArray::zeros_with(SHAPE, DType::F64, Context::cpu(0));
            let o16 = NDArray::zeros_with(SHAPE, DType::F16, Context::cpu(1));
            let o32 = NDArray::zeros(SHAPE);
            kv.pull(3, vec![&o64, &o16, &o32]).unwrap();
            assert_eq!(o64.dtype(), DType::F64);
            let want64: Vec<f64> = vals.iter().map(|&v| f64::from(v)).collect();
            assert_eq!(o64.to_vec::<f64>().unwrap(), want64, "{ty}: f32 → f64 is exact");
            let want16: Vec<half::f16> = vals.iter().map(|&v| half::f16::from_f32(v)).collect();
            assert_eq!(o16.to_vec::<half::f16>().unwrap(), want16, "{ty}: f32 → f16 rounds to nearest");
            assert_f32(&o32, &vals, &format!("{ty}: same dtype"));

            // pushpull and broadcast convert the same way
            let pushed = NDArray::full(SHAPE, 0.1);
            let out = NDArray::zeros_with(SHAPE, DType::F64, Context::cpu(0));
            kv.pushpull(3, &pushed, &out).unwrap();
            assert_eq!(out.to_vec::<f64>().unwrap(), vec![f64::from(0.1f32); 6], "{ty}: pushpull into f64");
            let bo = NDArray::zeros_with(SHAPE, DType::F64, Context::cpu(0));
            kv.broadcast(4, &NDArray::full(SHAPE, 0.2), &bo).unwrap();
            assert_eq!(bo.to_vec::<f64>().unwrap(), vec![f64::from(0.2f32); 6], "{ty}: broadcast into f64");

            // an f64 key pulled into f32 rounds
            kv.init(5, &NDArray::full_with(SHAPE, 0.1, DType::F64, Context::cpu(0))).unwrap();
            let o = NDArray::zeros(SHAPE);
            kv.pull(5, &o).unwrap();
            assert_eq!(o.to_vec::<f32>().unwrap(), vec![0.1f32; 6], "{ty}: f64 → f32");

            // but a push of another dtype is refused, so the sum is never silently converted
            let e = kv.push(3, &NDArray::full_with(SHAPE, 1.0, DType::F64, Context::cpu(0))).unwrap_err();
            assert!(matches!(e, Error::Store(StoreError::DTypeMismatch { .. })), "{e:?}");
        }
    });
}

// Difference 7: the updater receives the Key itself (MXNet: bytes in Python, internal ints in
// Perl).
#[test]
fn the_updater_receives_the_key_itself() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(["weight", "bias"], &[NDArray::zeros(SHAPE), NDArray::zeros(SHAPE)]).unwrap();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let s = Arc::clone(&seen);
            kv.set_updater(move |k: &Key, input: &NDArray, stored: &mut NDArray| {
                s.lock().unwrap().push(k.clone());
                stored.add_assign(input)?;
                Ok(())
            });
            let ones = [NDArray::ones(SHAPE), NDArray::ones(SHAPE)];
            kv.push(["bias", "weight"], &ones).unwrap();
            let outs = [NDArray::zeros(SHAPE), NDArray::zeros(SHAPE)];
            let report = kv.pull_with(["weight", "bias"], &outs, PullOptions { priority: 0, ignore_sparse: true }).unwrap();
            assert!(report.is_complete());
            outs.iter().for_each(|o| assert_all(o, 1.0, ty));
            assert_eq!(*seen.lock().unwrap(), vec![Key::from("weight"), Key::from("bias")], "{ty}: str keys, in init order");
        }
    });
}

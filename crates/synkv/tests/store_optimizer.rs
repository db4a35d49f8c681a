//! `set_optimizer` through the `local` and `device` stores (spec K6): a push runs the optimizer
//! on the merged gradient, and the result is exactly what `optimizer::Updater` computes when run
//! directly on copies of the weights with the same gradients (same code path, so f32 results are
//! compared bit for bit). Also: multi-device sums, per-key states, the `test` optimizer with
//! upstream's nightly arithmetic (T21/T22), saving and loading states, the errors of those calls,
//! replacing updaters, dtype rules and f16 multi-precision.
//!
//! Gradients pushed from several devices are multiples of 1/64 in [-1, 1): their f32 sums are
//! exact whatever the summation order, so the expected value does not depend on how the store
//! adds them up.

mod common;

use std::collections::BTreeMap;
use std::fmt::{Debug, Display};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use common::{bounded, with_timeout, STORE_TYPES};
use half::{bf16, f16};
use synkv::ndarray::{Buffer, BufferElement};
use synkv::optimizer::{
    self, AdaDelta, AdaGrad, AdamW, Ftrl, GradRef, Lamb, LrScheduler, Nag, Optimizer, RmsProp, Sgd, Updater, WeightMut,
};
use synkv::store::Error as StoreError;
use synkv::{create, engine, Context, DType, Error, KVStore, Key, NDArray};

// ---- helpers ----

/// SplitMix64: a small seeded generator, so every run pushes the same numbers.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `n` values uniform in `[lo, hi)`.
    fn uniform(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)).collect()
    }

    /// `n` multiples of 1/64 in `[-1, 1)`: sums of a few of them are exact in f32.
    fn dyadic(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| ((self.next_u64() % 128) as i32 - 64) as f32 / 64.0).collect()
    }
}

fn size(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A dense array of `data` on `ctx`.
fn arr_on<T: BufferElement>(shape: &[usize], data: Vec<T>, ctx: Context) -> NDArray {
    NDArray::from_buffer(shape.to_vec(), Buffer::from_vec(data), ctx).expect("data fits the shape")
}

/// A dense f32 array of `data` on `cpu(0)`.
fn arr(shape: &[usize], data: Vec<f32>) -> NDArray {
    arr_on(shape, data, Context::cpu(0))
}

/// Pulls `key` into a fresh dense array of `dtype` and returns its elements as `T`.
#[track_caller]
fn pulled<T: BufferElement>(kv: &KVStore, key: &Key, shape: &[usize]) -> Vec<T> {
    let out = NDArray::zeros_with(shape.to_vec(), T::DTYPE, Context::cpu(0));
    kv.pull(key, &out).unwrap_or_else(|e| panic!("pull {key}: {e}"));
    out.to_vec::<T>().unwrap_or_else(|e| panic!("reading the pull of {key}: {e}"))
}

/// Asserts that `got` and `expected` are the same values bit for bit.
#[track_caller]
fn assert_same_bits<T: Copy + Debug>(got: &[T], expected: &[T], bits: impl Fn(T) -> u64, what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    let differ: Vec<usize> = (0..got.len()).filter(|&i| bits(got[i]) != bits(expected[i])).collect();
    if let Some(&i) = differ.first() {
        panic!(
            "{what}: element {i}: the store gave {:?} but the updater run directly gives {:?} ({} of {} elements differ)",
            got[i],
            expected[i],
            differ.len(),
            got.len()
        );
    }
}

#[track_caller]
fn assert_same_f32(got: &[f32], expected: &[f32], what: &str) {
    assert_same_bits(got, expected, |x| u64::from(x.to_bits()), what)
}

/// The store error inside `res`, or a panic saying what came instead.
#[track_caller]
fn store_err<T: Debug>(res: synkv::Result<T>, what: &str) -> StoreError {
    match res {
        Err(Error::Store(e)) => e,
        other => panic!("{what}: expected a store error, got {other:?}"),
    }
}

/// The optimizer error inside `res`, or a panic saying what came instead.
#[track_caller]
fn optimizer_err<T: Debug>(res: synkv::Result<T>, what: &str) -> optimizer::Error {
    match res {
        Err(Error::Optimizer(e)) => e,
        other => panic!("{what}: expected an optimizer error, got {other:?}"),
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

/// What the store should hold, computed without a store: one `Updater` (per-key states and
/// counts, keyed by the key's display form, as the store does) over plain weight vectors.
struct Reference {
    updater: Updater,
    weights: BTreeMap<String, Vec<f32>>,
}

impl Reference {
    fn new(opt: &Optimizer) -> Reference {
        Reference { updater: Updater::try_new(opt.clone()).expect("a valid optimizer"), weights: BTreeMap::new() }
    }

    fn init(&mut self, key: &Key, weight: Vec<f32>) {
        self.weights.insert(key.to_string(), weight);
    }

    fn step(&mut self, key: &Key, grad: &[f32]) {
        let name = key.to_string();
        let w = self.weights.get_mut(&name).expect("the key was initialised");
        self.updater.update(&name, WeightMut::F32(w), GradRef::F32(grad)).unwrap_or_else(|e| panic!("reference update of {key}: {e}"));
    }

    fn weight(&self, key: &Key) -> &[f32] {
        &self.weights[&key.to_string()]
    }
}

/// A file path in the temp directory, unique to this process and call, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        TempFile(std::env::temp_dir().join(format!("synkv-store-optimizer-{}-{n}-{tag}.state", std::process::id())))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `wait_all` reports the first error raised anywhere in the process since the last one, so
/// tests that raise asynchronous errors or call `wait_all` take turns.
static ASYNC_ERRORS: Mutex<()> = Mutex::new(());

fn async_turn() -> MutexGuard<'static, ()> {
    ASYNC_ERRORS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One configuration of every optimizer synkv has (SGD with momentum and Adam first), with
/// non-default hyper-parameters where they change the arithmetic.
fn optimizers() -> Vec<(&'static str, Optimizer)> {
    vec![
        ("sgd momentum", Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }).with_learning_rate(0.1).with_wd(1e-3)),
        ("adam", Optimizer::adam().with_learning_rate(0.01).with_wd(1e-3)),
        ("sgd clip rescale", Optimizer::sgd().with_learning_rate(0.05).with_rescale_grad(2.0).with_clip_gradient(0.5)),
        ("sgd factor schedule", Optimizer::sgd().with_learning_rate(0.1).with_lr_scheduler(LrScheduler::factor(1, 0.5))),
        ("nag", Optimizer::from(Nag { momentum: 0.9, ..Nag::default() }).with_learning_rate(0.05).with_wd(1e-3)),
        ("signum", Optimizer::signum().with_learning_rate(0.01).with_wd(1e-3)),
        ("adamw", Optimizer::from(AdamW::default()).with_learning_rate(0.01).with_wd(1e-2)),
        ("lamb", Optimizer::from(Lamb::default()).with_learning_rate(0.01).with_wd(1e-2)),
        ("adagrad", Optimizer::from(AdaGrad::default()).with_learning_rate(0.1)),
        ("rmsprop centered", Optimizer::from(RmsProp { centered: true, ..RmsProp::default() }).with_learning_rate(0.01)),
        ("adadelta", Optimizer::from(AdaDelta::default()).with_wd(1e-3)),
        ("ftrl", Optimizer::from(Ftrl::default()).with_wd(1e-3)),
        ("test", Optimizer::test().with_rescale_grad(0.5)),
    ]
}

// ---- results equal the updater run directly ----

// Every optimizer, several steps, keys of several sizes (the last above the parallel-kernel
// bound of 65,536 elements); pushes alternate between one call for all keys and one call per key
// (in descending key order, mirrored by the reference).
#[test]
fn every_optimizer_matches_the_updater_run_directly() {
    with_timeout(180, || {
        let keys = [Key::Int(3), Key::Int(5), Key::Int(9)];
        let shapes: [&[usize]; 3] = [&[4, 4], &[3, 7], &[260, 260]];
        for ty in STORE_TYPES {
            for (name, opt) in optimizers() {
                let what = format!("{ty} {name}");
                let mut rng = Rng::new(7);
                let kv = create(ty).unwrap();
                let mut reference = Reference::new(&opt);
                for (k, s) in keys.iter().zip(shapes) {
                    let w0 = rng.uniform(size(s), -1.0, 1.0);
                    kv.init(k, &arr(s, w0.clone())).unwrap();
                    reference.init(k, w0);
                }
                kv.set_optimizer(opt.clone()).unwrap();
                assert!(kv.has_updater(), "{what}: set_optimizer installs an updater");
                for step in 0..4 {
                    let grads: Vec<Vec<f32>> = shapes.iter().map(|s| rng.uniform(size(s), -1.0, 1.0)).collect();
                    let arrays: Vec<NDArray> = shapes.iter().zip(&grads).map(|(s, g)| arr(s, g.clone())).collect();
                    if step % 2 == 0 {
                        kv.push(&keys[..], &arrays).unwrap();
                        for (k, g) in keys.iter().zip(&grads) {
                            reference.step(k, g);
                        }
                    } else {
                        for i in (0..keys.len()).rev() {
                            kv.push(&keys[i], &arrays[i]).unwrap();
                            reference.step(&keys[i], &grads[i]);
                        }
                    }
                    for (k, s) in keys.iter().zip(shapes) {
                        assert_same_f32(&pulled::<f32>(&kv, k, s), reference.weight(k), &format!("{what}: step {step}, key {k}"));
                    }
                }
                // the updates really moved the weights
                let first = pulled::<f32>(&kv, &keys[0], shapes[0]);
                assert!(first.iter().all(|x| x.is_finite()), "{what}: finite weights");
            }
        }
    });
}

// f64 keys go through the f64 kernels; a pushpull returns the updated weight.
#[test]
fn f64_weights_and_pushpull_match_the_updater() {
    bounded(|| {
        for ty in STORE_TYPES {
            let opt = Optimizer::adam().with_learning_rate(0.01).with_wd(1e-3);
            let shape = [5, 3];
            let mut rng = Rng::new(64);
            let mut w: Vec<f64> = rng.uniform(15, -1.0, 1.0).into_iter().map(f64::from).collect();
            let kv = create(ty).unwrap();
            kv.init("w", &arr_on(&shape, w.clone(), Context::cpu(0))).unwrap();
            kv.set_optimizer(opt.clone()).unwrap();
            let mut upd = Updater::try_new(opt).unwrap();
            for step in 0..3 {
                let g: Vec<f64> = rng.uniform(15, -1.0, 1.0).into_iter().map(f64::from).collect();
                upd.update("w", WeightMut::F64(&mut w), GradRef::F64(&g)).unwrap();
                let out = NDArray::zeros_with(shape, DType::F64, Context::cpu(0));
                kv.pushpull("w", &arr_on(&shape, g, Context::cpu(0)), &out).unwrap();
                let got = out.to_vec::<f64>().unwrap();
                assert_same_bits(&got, &w, f64::to_bits, &format!("{ty} f64 adam step {step} (pushpull output)"));
            }
        }
    });
}

// K3.2 / K6: values of one key from several devices (a per-device list, or the key repeated in
// the key list) are summed first and the optimizer runs once on the sum.
#[test]
fn multi_device_pushes_are_summed_before_one_update() {
    bounded(|| {
        let shape = [6, 5];
        let n = size(&shape);
        for ty in STORE_TYPES {
            let opt = Optimizer::adam().with_learning_rate(0.05);
            let mut rng = Rng::new(4);
            let w0 = rng.dyadic(n);
            let kv = create(ty).unwrap();
            kv.init([3, 4], &[arr(&shape, w0.clone()), arr(&shape, w0.clone())]).unwrap();
            kv.set_optimizer(opt.clone()).unwrap();
            let mut reference = Reference::new(&opt);
            reference.init(&Key::Int(3), w0.clone());
            reference.init(&Key::Int(4), w0.clone());
            for step in 0..3 {
                let per_dev: Vec<Vec<f32>> = (0..4).map(|_| rng.dyadic(n)).collect();
                let sum: Vec<f32> = (0..n).map(|e| per_dev.iter().map(|g| g[e]).sum()).collect();
                // key 3: a list of four per-device values
                let vals: Vec<NDArray> = per_dev.iter().enumerate().map(|(d, g)| arr_on(&shape, g.clone(), Context::cpu(d))).collect();
                kv.push(3, &vals).unwrap();
                // key 4: the key repeated in the key list, one value each
                kv.push([4, 4, 4, 4], &vals).unwrap();
                reference.step(&Key::Int(3), &sum);
                reference.step(&Key::Int(4), &sum);
                for k in [3, 4] {
                    let key = Key::Int(k);
                    assert_same_f32(&pulled::<f32>(&kv, &key, &shape), reference.weight(&key), &format!("{ty}: step {step}, key {k}"));
                }
            }
            // four separate updates would have given something else (Adam is not additive)
            let mut separate = Reference::new(&opt);
            separate.init(&Key::Int(3), w0.clone());
            let g = rng.dyadic(n);
            for _ in 0..4 {
                separate.step(&Key::Int(3), &g);
            }
            let mut once = Reference::new(&opt);
            once.init(&Key::Int(3), w0);
            once.step(&Key::Int(3), &g.iter().map(|x| 4.0 * x).collect::<Vec<f32>>());
            assert_ne!(separate.weight(&Key::Int(3)), once.weight(&Key::Int(3)), "the check above can tell one summed update from four");
        }
    });
}

// Each key has its own state and count (K6.7, K6.10): a key updated late starts at t = 1, and
// the per-key multipliers are found by the key's display form, for int and str keys.
#[test]
fn states_and_multipliers_are_per_key_for_int_and_str_keys() {
    bounded(|| {
        let shape = [3, 4];
        let n = size(&shape);
        for ty in STORE_TYPES {
            for keys in [vec![Key::Int(3), Key::Int(5), Key::Int(7)], vec![Key::from("a"), Key::from("b"), Key::from("c")]] {
                let (k0, k1, k2) = (&keys[0], &keys[1], &keys[2]);
                let what = format!("{ty} keys {k0},{k1},{k2}");
                // k1 frozen by lr_mult 0, k2 with double lr and no weight decay
                let opt = Optimizer::adam()
                    .with_learning_rate(0.02)
                    .with_wd(0.01)
                    .with_lr_mult(k1.to_string(), 0.0)
                    .with_lr_mult(k2.to_string(), 2.0)
                    .with_wd_mult(k2.to_string(), 0.0);
                let mut rng = Rng::new(11);
                let kv = create(ty).unwrap();
                let mut reference = Reference::new(&opt);
                let w0: Vec<Vec<f32>> = keys.iter().map(|_| rng.uniform(n, -1.0, 1.0)).collect();
                for (k, w) in keys.iter().zip(&w0) {
                    kv.init(k, &arr(&shape, w.clone())).unwrap();
                    reference.init(k, w.clone());
                }
                kv.set_optimizer(opt.clone()).unwrap();
                // k0 three times, k1 once, then all three together
                for _ in 0..3 {
                    let g = rng.uniform(n, -1.0, 1.0);
                    kv.push(k0, &arr(&shape, g.clone())).unwrap();
                    reference.step(k0, &g);
                }
                let g1 = rng.uniform(n, -1.0, 1.0);
                kv.push(k1, &arr(&shape, g1.clone())).unwrap();
                reference.step(k1, &g1);
                let gs: Vec<Vec<f32>> = keys.iter().map(|_| rng.uniform(n, -1.0, 1.0)).collect();
                let arrays: Vec<NDArray> = gs.iter().map(|g| arr(&shape, g.clone())).collect();
                kv.push(&keys[..], &arrays).unwrap();
                for (k, g) in keys.iter().zip(&gs) {
                    reference.step(k, g);
                }
                for k in &keys {
                    assert_same_f32(&pulled::<f32>(&kv, k, &shape), reference.weight(k), &format!("{what}: key {k}"));
                }
                assert_eq!(pulled::<f32>(&kv, k1, &shape), w0[1], "{what}: lr_mult 0 for {k1} keeps its weight");
                assert_eq!(reference.updater.update_count(&k0.to_string()), Some(4));
                assert_eq!(reference.updater.update_count(&k2.to_string()), Some(1));

                // k2's first update used t = 1 (its own count), not the 4 of k0
                let mut fresh = Reference::new(&opt);
                fresh.init(k2, w0[2].clone());
                fresh.step(k2, &gs[2]);
                assert_same_f32(&pulled::<f32>(&kv, k2, &shape), fresh.weight(k2), &format!("{what}: {k2} starts with its own state"));
            }
        }
    });
}

// ---- the test optimizer: upstream's nightly arithmetic (T21, T22, K6.13) ----

const T21_KEYS: [i32; 3] = [3, 5, 7];
/// Upstream's (4,4), (100,100) and a big array (upstream (2000,2000), above the big-array bound).
const T21_SHAPES: [[usize; 2]; 3] = [[4, 4], [100, 100], [1200, 1200]];
const T21_DEVICES: usize = 4;
const T21_REPEATS: usize = 3;
const T21_RATE: f64 = 0.1;

/// Rows `0..rows` of `data` that are not all zero, as a row_sparse array on `ctx`.
fn to_row_sparse(shape: &[usize], data: &[f32], ctx: Context) -> NDArray {
    let row_len = shape[1];
    let mut ids = Vec::new();
    let mut rows = Vec::new();
    for (r, row) in data.chunks(row_len).enumerate() {
        if row.iter().any(|&x| x != 0.0) {
            ids.push(r as i64);
            rows.extend_from_slice(row);
        }
    }
    NDArray::row_sparse(shape.to_vec(), ids, Buffer::from_vec(rows), ctx).unwrap()
}

/// Relative L1 error `Σ|got − expected| / Σ|expected|`.
fn relative_l1(got: &[f32], expected: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(expected).map(|(&g, &e)| (f64::from(g) - e).abs()).sum();
    let den: f64 = expected.iter().map(|e| e.abs()).sum();
    num / den
}

/// T21 (one key per call) or T22 (all keys in one call): the test optimizer `w += 0.1·g`,
/// 4 devices, uniform [-1, 1) data; after each repeat every output is within 1e-6 relative L1
/// of `res += 0.1·Σ_devices g`. With `sparse`, each device's gradient has a third of its rows
/// zero and is pushed as row_sparse (upstream pushes `.tostype('row_sparse')` values).
fn t21_case(ty: &str, sparse: bool, grouped: bool) {
    let what = format!("{ty} {} {}", if grouped { "T22" } else { "T21" }, if sparse { "row_sparse" } else { "dense" });
    let kv = create(ty).unwrap();
    kv.set_optimizer(Optimizer::test().with_rescale_grad(T21_RATE)).unwrap();
    for (k, s) in T21_KEYS.iter().zip(&T21_SHAPES) {
        kv.init(*k, &NDArray::zeros(s.to_vec())).unwrap();
    }
    let mut res: Vec<Vec<f64>> = T21_SHAPES.iter().map(|s| vec![0.0; size(s)]).collect();
    let mut rng = Rng::new(21 + u64::from(sparse));
    for rep in 0..T21_REPEATS {
        let mut vals: Vec<Vec<NDArray>> = Vec::new();
        for (j, s) in T21_SHAPES.iter().enumerate() {
            let mut per_key = Vec::new();
            for d in 0..T21_DEVICES {
                let mut g = rng.uniform(size(s), -1.0, 1.0);
                if sparse {
                    for (r, row) in g.chunks_mut(s[1]).enumerate() {
                        if (r + d) % 3 == 0 {
                            row.fill(0.0);
                        }
                    }
                }
                for (acc, &x) in res[j].iter_mut().zip(&g) {
                    *acc += T21_RATE * f64::from(x);
                }
                let ctx = Context::cpu(d);
                per_key.push(if sparse { to_row_sparse(s, &g, ctx) } else { arr_on(s, g, ctx) });
            }
            vals.push(per_key);
        }
        let outs: Vec<Vec<NDArray>> =
            T21_SHAPES.iter().map(|s| (0..T21_DEVICES).map(|d| NDArray::zeros_on(s.to_vec(), Context::cpu(d))).collect()).collect();
        if grouped {
            kv.push(T21_KEYS, &vals).unwrap();
            kv.pull(T21_KEYS, &outs).unwrap();
        } else {
            for j in 0..T21_KEYS.len() {
                kv.push(T21_KEYS[j], &vals[j]).unwrap();
            }
            for j in 0..T21_KEYS.len() {
                kv.pull(T21_KEYS[j], &outs[j]).unwrap();
            }
        }
        for (j, key_outs) in outs.iter().enumerate() {
            // upstream: Σ over the outputs of |o − res|, divided by Σ|res|, below 1e-6
            let mut err = 0.0;
            for o in key_outs {
                let got = o.to_vec::<f32>().unwrap();
                let e = relative_l1(&got, &res[j]);
                assert!(e < 1e-6, "{what}: repeat {rep}, key {}: relative L1 error {e}", T21_KEYS[j]);
                err += e;
            }
            assert!(err < 1e-6, "{what}: repeat {rep}, key {}: upstream's summed error {err}", T21_KEYS[j]);
        }
    }
    // a sanity check that real numbers were compared: the expected values are not tiny
    let mean_abs: f64 = res[2].iter().map(|x| x.abs()).sum::<f64>() / res[2].len() as f64;
    assert!(mean_abs > 0.1, "{what}: mean |res| {mean_abs}");
}

#[test]
fn t21_test_optimizer_one_key_per_call() {
    with_timeout(300, || {
        for ty in STORE_TYPES {
            for sparse in [false, true] {
                t21_case(ty, sparse, false);
            }
        }
    });
}

#[test]
fn t22_test_optimizer_key_lists() {
    with_timeout(300, || {
        for ty in STORE_TYPES {
            for sparse in [false, true] {
                t21_case(ty, sparse, true);
            }
        }
    });
}

// K6.13 in small: `w += rescale·g`, ignoring lr and wd, exactly.
#[test]
fn test_optimizer_adds_rescaled_gradients() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init("w", &NDArray::full([2, 3], 1.0)).unwrap();
            kv.set_optimizer(Optimizer::test().with_rescale_grad(2.0).with_learning_rate(0.5).with_wd(0.1)).unwrap();
            kv.push("w", &common::per_device(&[2, 3], 4, 0.25)).unwrap();
            common::assert_all(&pulled_array(&kv, "w", &[2, 3]), 3.0, &format!("{ty}: 1 + 2·(4·0.25)"));
            kv.push("w", &NDArray::full([2, 3], -1.5)).unwrap();
            common::assert_all(&pulled_array(&kv, "w", &[2, 3]), 0.0, &format!("{ty}: 3 + 2·(−1.5)"));
        }
    });
}

/// Pulls `key` into a fresh dense f32 array (pre-filled with −777, so an unwritten output shows).
#[track_caller]
fn pulled_array(kv: &KVStore, key: impl Into<Key>, shape: &[usize]) -> NDArray {
    let key = key.into();
    let out = NDArray::full(shape.to_vec(), -777.0);
    kv.pull(&key, &out).unwrap_or_else(|e| panic!("pull {key}: {e}"));
    out
}

// ---- saving and loading optimizer states ----

/// Pushes one gradient per key in one call.
fn push_all(kv: &KVStore, keys: &[Key], shapes: &[[usize; 2]], grads: &[Vec<f32>]) {
    let arrays: Vec<NDArray> = shapes.iter().zip(grads).map(|(s, g)| arr(s, g.clone())).collect();
    kv.push(keys, &arrays).unwrap();
}

fn pull_all(kv: &KVStore, keys: &[Key], shapes: &[[usize; 2]]) -> Vec<Vec<f32>> {
    keys.iter().zip(shapes).map(|(k, s)| pulled::<f32>(kv, k, s)).collect()
}

// Store A: 2 steps, save, 1 more step → wA. Store B: init with A's weights after step 2, the same
// optimizer, load the file, the same third step → wB == wA bit for bit. A store C that skips the
// load ends elsewhere, so the file carried the state.
#[test]
fn states_saved_by_one_store_resume_in_another() {
    bounded(|| {
        let shapes = [[4, 4], [2, 3]];
        for ty in STORE_TYPES {
            for (name, opt) in [
                ("adam", Optimizer::adam().with_learning_rate(0.05).with_wd(1e-3)),
                ("sgd momentum", Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }).with_learning_rate(0.1)),
                ("rmsprop centered", Optimizer::from(RmsProp { centered: true, ..RmsProp::default() }).with_learning_rate(0.01)),
                ("adagrad", Optimizer::adagrad().with_learning_rate(0.1)),
            ] {
                for keys in [vec![Key::Int(3), Key::Int(5)], vec![Key::from("w"), Key::from("b")]] {
                    let what = format!("{ty} {name} keys {},{}", keys[0], keys[1]);
                    let mut rng = Rng::new(99);
                    let w0: Vec<Vec<f32>> = shapes.iter().map(|s| rng.uniform(size(s), -1.0, 1.0)).collect();
                    let grads: Vec<Vec<Vec<f32>>> =
                        (0..3).map(|_| shapes.iter().map(|s| rng.uniform(size(s), -1.0, 1.0)).collect()).collect();
                    let file = TempFile::new("resume");

                    let a = create(ty).unwrap();
                    let w0_arrays: Vec<NDArray> = shapes.iter().zip(&w0).map(|(s, w)| arr(s, w.clone())).collect();
                    a.init(&keys[..], &w0_arrays).unwrap();
                    a.set_optimizer(opt.clone()).unwrap();
                    push_all(&a, &keys, &shapes, &grads[0]);
                    push_all(&a, &keys, &shapes, &grads[1]);
                    let w2 = pull_all(&a, &keys, &shapes);
                    a.save_optimizer_states(file.path()).unwrap_or_else(|e| panic!("{what}: save: {e}"));
                    push_all(&a, &keys, &shapes, &grads[2]);
                    let wa = pull_all(&a, &keys, &shapes);

                    let w2_arrays: Vec<NDArray> = shapes.iter().zip(&w2).map(|(s, w)| arr(s, w.clone())).collect();
                    let b = create(ty).unwrap();
                    b.init(&keys[..], &w2_arrays).unwrap();
                    b.set_optimizer(opt.clone()).unwrap();
                    b.load_optimizer_states(file.path()).unwrap_or_else(|e| panic!("{what}: load: {e}"));
                    push_all(&b, &keys, &shapes, &grads[2]);
                    let wb = pull_all(&b, &keys, &shapes);
                    for i in 0..keys.len() {
                        assert_same_f32(&wb[i], &wa[i], &format!("{what}: key {} resumed from the file", keys[i]));
                    }

                    let c = create(ty).unwrap();
                    c.init(&keys[..], &w2_arrays).unwrap();
                    c.set_optimizer(opt.clone()).unwrap();
                    push_all(&c, &keys, &shapes, &grads[2]);
                    assert_ne!(pull_all(&c, &keys, &shapes), wa, "{what}: without the states the third step differs");

                    // the file is complete: counts and the optimizer description come back
                    let bytes = std::fs::read(file.path()).unwrap();
                    let restored = Updater::from_saved_states(&bytes).unwrap();
                    assert_eq!(restored.optimizer(), &opt, "{what}: the file records the optimizer");
                    for k in &keys {
                        assert_eq!(restored.update_count(&k.to_string()), Some(2), "{what}: count of {k}");
                    }
                }
            }
        }
    });
}

// The f32 master copy of a multi-precision f16 weight is part of the saved state: a store that
// loads it continues from the master, not from the rounded f16 weight, exactly as the saving
// store does. Loading it into an optimizer without multi_precision is refused.
#[test]
fn multi_precision_master_copies_are_saved_and_loaded() {
    bounded(|| {
        let shape = [4, 4];
        for ty in STORE_TYPES {
            let opt = Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }).with_learning_rate(0.01).with_multi_precision(true);
            let mut rng = Rng::new(1616);
            let w0: Vec<f16> = rng.uniform(16, -1.0, 1.0).into_iter().map(f16::from_f32).collect();
            let grads: Vec<Vec<f16>> = (0..3).map(|_| rng.uniform(16, -1.0, 1.0).into_iter().map(f16::from_f32).collect()).collect();
            let a = create(ty).unwrap();
            a.init(3, &arr_on(&shape, w0, Context::cpu(0))).unwrap();
            a.set_optimizer(opt.clone()).unwrap();
            for g in &grads[..2] {
                a.push(3, &arr_on(&shape, g.clone(), Context::cpu(0))).unwrap();
            }
            let w2 = pulled::<f16>(&a, &Key::Int(3), &shape);
            let file = TempFile::new("master");
            a.save_optimizer_states(file.path()).unwrap();
            a.push(3, &arr_on(&shape, grads[2].clone(), Context::cpu(0))).unwrap();
            let wa = pulled::<f16>(&a, &Key::Int(3), &shape);

            let restored = Updater::from_saved_states(&std::fs::read(file.path()).unwrap()).unwrap();
            let master = restored.state("3").and_then(|s| s.master_weight()).expect("the file holds the f32 master copy");
            assert!(
                master.iter().zip(&w2).any(|(m, w)| *m != w.to_f32()),
                "{ty}: the master copy keeps more than the f16 weight (else this test could not tell them apart)"
            );

            let b = create(ty).unwrap();
            b.init(3, &arr_on(&shape, w2.clone(), Context::cpu(0))).unwrap();
            b.set_optimizer(opt.clone()).unwrap();
            b.load_optimizer_states(file.path()).unwrap();
            b.push(3, &arr_on(&shape, grads[2].clone(), Context::cpu(0))).unwrap();
            let wb = pulled::<f16>(&b, &Key::Int(3), &shape);
            assert_same_bits(&wb, &wa, |x| u64::from(x.to_bits()), &format!("{ty}: f16 resumed from the master copy"));

            let plain = create(ty).unwrap();
            plain.init(3, &arr_on(&shape, w2, Context::cpu(0))).unwrap();
            plain.set_optimizer(opt.clone().with_multi_precision(false)).unwrap();
            let e = optimizer_err(plain.load_optimizer_states(file.path()), &format!("{ty}: master copy without multi_precision"));
            assert!(matches!(&e, optimizer::Error::StateMismatch { key, .. } if key == "3"), "{ty}: {e:?}");
            assert_msg(&e, &["master copy", "multi_precision"]);
        }
    });
}

// save_optimizer_states waits for every scheduled update: pushes not yet read are in the file.
#[test]
fn save_waits_for_scheduled_updates() {
    bounded(|| {
        for ty in STORE_TYPES {
            let shape = [200, 200];
            let opt = Optimizer::from(Sgd { momentum: 0.5, ..Sgd::default() }).with_learning_rate(0.1);
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::zeros(shape)).unwrap();
            kv.set_optimizer(opt.clone()).unwrap();
            let g = NDArray::full(shape, 1.0);
            for _ in 0..5 {
                kv.push(3, &g).unwrap();
            }
            let file = TempFile::new("pending");
            kv.save_optimizer_states(file.path()).unwrap();
            let restored = Updater::from_saved_states(&std::fs::read(file.path()).unwrap()).unwrap();
            assert_eq!(restored.update_count("3"), Some(5), "{ty}: all five scheduled updates are in the file");
            let mut reference = Reference::new(&opt);
            reference.init(&Key::Int(3), vec![0.0; size(&shape)]);
            for _ in 0..5 {
                reference.step(&Key::Int(3), &vec![1.0; size(&shape)]);
            }
            let momentum = restored.state("3").and_then(|s| s.slot_f32("momentum")).expect("a momentum slot").to_vec();
            let expected = reference.updater.state("3").and_then(|s| s.slot_f32("momentum")).unwrap().to_vec();
            assert_same_f32(&momentum, &expected, &format!("{ty}: momentum after five updates"));
            assert_same_f32(&pulled::<f32>(&kv, &Key::Int(3), &shape), reference.weight(&Key::Int(3)), ty);
        }
    });
}

// ---- errors of set_optimizer / save / load; the store works after each ----

#[test]
fn save_and_load_without_an_optimizer_are_refused() {
    bounded(|| {
        for ty in STORE_TYPES {
            // a valid state file, so that a load can only fail for the missing optimizer
            let valid = TempFile::new("valid");
            let src = create(ty).unwrap();
            src.init(3, &NDArray::ones([2, 2])).unwrap();
            src.set_optimizer(Optimizer::sgd()).unwrap();
            src.push(3, &NDArray::ones([2, 2])).unwrap();
            src.save_optimizer_states(valid.path()).unwrap();

            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::ones([2, 2])).unwrap();
            for custom in [false, true] {
                if custom {
                    kv.set_updater(|_k: &Key, input: &NDArray, stored: &mut NDArray| {
                        stored.add_assign(input)?;
                        Ok(())
                    });
                }
                let what = format!("{ty} {}", if custom { "with a custom updater" } else { "without updater" });
                let out = TempFile::new("never-written");
                for (op, res) in [
                    ("save_optimizer_states", kv.save_optimizer_states(out.path())),
                    ("load_optimizer_states", kv.load_optimizer_states(valid.path())),
                ] {
                    let e = store_err(res, &format!("{what}: {op}"));
                    match &e {
                        StoreError::Unsupported { op: o, store_type, .. } => assert_eq!((*o, store_type.as_str()), (op, ty), "{what}"),
                        other => panic!("{what}: {op}: expected Unsupported, got {other:?}"),
                    }
                    assert_msg(&e, &[op, "set_optimizer"]);
                    if custom {
                        assert_msg(&e, &["custom updater"]);
                    }
                }
                assert!(!out.path().exists(), "{what}: a refused save writes no file");
            }
            // the store works: the custom updater still adds
            kv.push(3, &NDArray::full([2, 2], 2.0)).unwrap();
            common::assert_all(&pulled_array(&kv, 3, &[2, 2]), 3.0, &format!("{ty}: 1 + 2 after the refusals"));
        }
    });
}

/// A store with key 3 = `w0` under `opt` after one step of `g`, and its reference.
fn one_step_store(ty: &str, opt: &Optimizer, shape: &[usize], w0: &[f32], g: &[f32]) -> (KVStore, Reference) {
    let kv = create(ty).unwrap();
    kv.init(3, &arr(shape, w0.to_vec())).unwrap();
    kv.set_optimizer(opt.clone()).unwrap();
    kv.push(3, &arr(shape, g.to_vec())).unwrap();
    let mut reference = Reference::new(opt);
    reference.init(&Key::Int(3), w0.to_vec());
    reference.step(&Key::Int(3), g);
    (kv, reference)
}

// A file from another optimizer, or from the same optimizer with other state slots, is refused
// and names both sides; the states are unchanged (the next step continues as if nothing happened).
#[test]
fn loading_another_optimizers_states_is_refused() {
    bounded(|| {
        let shape = [3, 3];
        for ty in STORE_TYPES {
            let mut rng = Rng::new(5);
            let w0 = rng.uniform(9, -1.0, 1.0);
            let g1 = rng.uniform(9, -1.0, 1.0);
            let momentum = Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }).with_learning_rate(0.1);
            let (src, _) = one_step_store(ty, &momentum, &shape, &w0, &g1);
            let sgd_file = TempFile::new("sgd");
            src.save_optimizer_states(sgd_file.path()).unwrap();

            let adam = Optimizer::adam().with_learning_rate(0.05);
            let (kv, mut reference) = one_step_store(ty, &adam, &shape, &w0, &g1);
            let e = optimizer_err(kv.load_optimizer_states(sgd_file.path()), &format!("{ty}: sgd states into adam"));
            match &e {
                optimizer::Error::OptimizerMismatch { file, current } => assert_eq!((file.as_str(), *current), ("sgd", "adam")),
                other => panic!("{ty}: expected OptimizerMismatch, got {other:?}"),
            }
            assert_msg(&e, &["`sgd`", "`adam`"]);
            let g2 = rng.uniform(9, -1.0, 1.0);
            kv.push(3, &arr(&shape, g2.clone())).unwrap();
            reference.step(&Key::Int(3), &g2);
            assert_same_f32(&pulled::<f32>(&kv, &Key::Int(3), &shape), reference.weight(&Key::Int(3)), &format!("{ty}: adam continues"));

            // same optimizer, other settings: momentum 0.9 states into plain SGD
            let plain = Optimizer::sgd().with_learning_rate(0.1);
            let (kv, mut reference) = one_step_store(ty, &plain, &shape, &w0, &g1);
            let e = optimizer_err(kv.load_optimizer_states(sgd_file.path()), &format!("{ty}: momentum states into plain sgd"));
            assert!(matches!(&e, optimizer::Error::StateMismatch { key, .. } if key == "3"), "{ty}: {e:?}");
            assert_msg(&e, &["key 3", "momentum"]);
            kv.push(3, &arr(&shape, g2.clone())).unwrap();
            reference.step(&Key::Int(3), &g2);
            assert_same_f32(&pulled::<f32>(&kv, &Key::Int(3), &shape), reference.weight(&Key::Int(3)), &format!("{ty}: sgd continues"));
        }
    });
}

// Truncated, corrupted, empty and foreign files are refused with a clear error; a missing file is
// an I/O error naming the path. Nothing changes: the next step continues, and loading the intact
// file afterwards still works.
#[test]
fn loading_a_corrupted_state_file_is_refused() {
    bounded(|| {
        let shape = [4, 4];
        for ty in STORE_TYPES {
            let mut rng = Rng::new(6);
            let w0 = rng.uniform(16, -1.0, 1.0);
            let g1 = rng.uniform(16, -1.0, 1.0);
            let opt = Optimizer::adam().with_learning_rate(0.05);
            let (kv, mut reference) = one_step_store(ty, &opt, &shape, &w0, &g1);
            let valid_file = TempFile::new("intact");
            kv.save_optimizer_states(valid_file.path()).unwrap();
            let valid = std::fs::read(valid_file.path()).unwrap();
            assert!(valid.len() > 64, "{ty}: a real file");

            let mut flipped_blob = valid.clone();
            let mid = valid.len() - 40;
            flipped_blob[mid] ^= 0x10;
            let mut flipped_magic = valid.clone();
            flipped_magic[0] ^= 0xFF;
            let cases: Vec<(&str, Vec<u8>)> = vec![
                ("truncated to half", valid[..valid.len() / 2].to_vec()),
                ("last byte missing", valid[..valid.len() - 1].to_vec()),
                ("one byte appended", [valid.as_slice(), &[0u8]].concat()),
                ("empty", Vec::new()),
                ("ten bytes", valid[..10].to_vec()),
                ("a state byte flipped", flipped_blob),
                ("the magic flipped", flipped_magic),
                ("not a state file", b"this is not an optimizer state file, just text".to_vec()),
            ];
            let bad = TempFile::new("bad");
            for (case, bytes) in cases {
                std::fs::write(bad.path(), &bytes).unwrap();
                let e = optimizer_err(kv.load_optimizer_states(bad.path()), &format!("{ty}: {case}"));
                assert!(matches!(&e, optimizer::Error::CorruptStateFile { .. }), "{ty}: {case}: expected CorruptStateFile, got {e:?}");
                assert_msg(&e, &["corrupted or not a synkv optimizer-state file"]);
            }
            let missing = TempFile::new("missing");
            let e = optimizer_err(kv.load_optimizer_states(missing.path()), &format!("{ty}: missing file"));
            assert!(matches!(&e, optimizer::Error::Io { action: "read", path, .. } if path == missing.path()), "{ty}: {e:?}");
            assert_msg(&e, &[&missing.path().display().to_string()]);

            // nothing changed: the second step continues from the first
            let g2 = rng.uniform(16, -1.0, 1.0);
            kv.push(3, &arr(&shape, g2.clone())).unwrap();
            reference.step(&Key::Int(3), &g2);
            let w2 = pulled::<f32>(&kv, &Key::Int(3), &shape);
            assert_same_f32(&w2, reference.weight(&Key::Int(3)), &format!("{ty}: step 2 after the refused loads"));

            // the intact file (states after step 1) still loads, and replaces the states
            kv.load_optimizer_states(valid_file.path()).unwrap();
            let g3 = rng.uniform(16, -1.0, 1.0);
            kv.push(3, &arr(&shape, g3.clone())).unwrap();
            let mut resumed = Updater::from_saved_states(&valid).unwrap();
            let mut expected = w2;
            resumed.update("3", WeightMut::F32(&mut expected), GradRef::F32(&g3)).unwrap();
            assert_same_f32(&pulled::<f32>(&kv, &Key::Int(3), &shape), &expected, &format!("{ty}: step 3 from the states of step 1"));
        }
    });
}

// An invalid optimizer is refused by set_optimizer and the installed one stays.
#[test]
fn an_invalid_optimizer_is_refused_and_the_old_one_kept() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::zeros([2, 2])).unwrap();
            kv.set_optimizer(Optimizer::test()).unwrap();
            for (param, bad) in [
                ("momentum", Optimizer::from(Sgd { momentum: 1.5, ..Sgd::default() })),
                ("learning_rate", Optimizer::adam().with_learning_rate(-0.1)),
                ("clip_gradient", Optimizer::sgd().with_clip_gradient(0.0)),
            ] {
                let e = optimizer_err(kv.set_optimizer(bad), &format!("{ty}: {param}"));
                assert!(matches!(&e, optimizer::Error::InvalidParameter { param: p, .. } if p == param), "{ty}: {e:?}");
                assert_msg(&e, &[param]);
            }
            kv.push(3, &NDArray::full([2, 2], 2.0)).unwrap();
            common::assert_all(&pulled_array(&kv, 3, &[2, 2]), 2.0, &format!("{ty}: the test optimizer still adds"));
        }
    });
}

// set_optimizer replaces a custom updater, set_updater replaces an optimizer, a second
// set_optimizer starts with empty states, and clear_updater goes back to assign.
#[test]
fn set_optimizer_and_set_updater_replace_each_other() {
    bounded(|| {
        let shape = [2, 2];
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::zeros(shape)).unwrap();
            kv.set_updater(|_k: &Key, input: &NDArray, stored: &mut NDArray| {
                stored.add_assign(input)?;
                Ok(())
            });
            kv.push(3, &NDArray::ones(shape)).unwrap();
            common::assert_all(&pulled_array(&kv, 3, &shape), 1.0, &format!("{ty}: custom updater += 1"));

            kv.set_optimizer(Optimizer::test().with_rescale_grad(2.0)).unwrap();
            kv.push(3, &NDArray::ones(shape)).unwrap();
            common::assert_all(&pulled_array(&kv, 3, &shape), 3.0, &format!("{ty}: the optimizer replaced the updater: += 2"));
            let file = TempFile::new("replace");
            kv.save_optimizer_states(file.path()).unwrap_or_else(|e| panic!("{ty}: an optimizer is installed: {e}"));

            kv.set_updater(|_k: &Key, input: &NDArray, stored: &mut NDArray| {
                stored.sub_assign(input)?;
                Ok(())
            });
            kv.push(3, &NDArray::ones(shape)).unwrap();
            common::assert_all(&pulled_array(&kv, 3, &shape), 2.0, &format!("{ty}: the updater replaced the optimizer: −= 1"));
            let e = store_err(kv.save_optimizer_states(file.path()), &format!("{ty}: save after set_updater"));
            assert!(matches!(e, StoreError::Unsupported { op: "save_optimizer_states", .. }), "{ty}: {e:?}");

            // a new optimizer starts without states: Adam's first step again (t = 1)
            let adam = Optimizer::adam().with_learning_rate(0.1);
            kv.set_optimizer(adam.clone()).unwrap();
            let g = vec![0.5f32, -0.25, 1.0, -1.0];
            for _ in 0..2 {
                kv.push(3, &arr(&shape, g.clone())).unwrap();
            }
            let before = pulled::<f32>(&kv, &Key::Int(3), &shape);
            kv.set_optimizer(adam.clone()).unwrap();
            kv.push(3, &arr(&shape, g.clone())).unwrap();
            let mut fresh = Reference::new(&adam);
            fresh.init(&Key::Int(3), before);
            fresh.step(&Key::Int(3), &g);
            assert_same_f32(&pulled::<f32>(&kv, &Key::Int(3), &shape), fresh.weight(&Key::Int(3)), &format!("{ty}: states reset"));

            kv.clear_updater();
            assert!(!kv.has_updater());
            kv.push(3, &NDArray::full(shape, 7.0)).unwrap();
            common::assert_all(&pulled_array(&kv, 3, &shape), 7.0, &format!("{ty}: assign again"));
        }
    });
}

// Pushes scheduled before set_optimizer keep the optimizer they were scheduled with.
#[test]
fn pushes_scheduled_before_set_optimizer_keep_their_optimizer() {
    bounded(|| {
        let shape = [300, 300];
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::zeros(shape)).unwrap();
            kv.set_optimizer(Optimizer::test()).unwrap();
            let g = NDArray::ones(shape);
            for _ in 0..3 {
                kv.push(3, &g).unwrap();
            }
            kv.set_optimizer(Optimizer::test().with_rescale_grad(10.0)).unwrap();
            kv.push(3, &g).unwrap();
            let out = NDArray::zeros(shape);
            kv.pull(3, &out).unwrap();
            common::assert_all(&out, 13.0, &format!("{ty}: 3 pushes at rescale 1, then one at rescale 10"));
        }
    });
}

// Optimizers update float keys only: a push of an i32 (or i64) key with an optimizer installed
// is refused by push itself, changes nothing, and the store keeps working.
#[test]
fn an_optimizer_refuses_integer_keys_at_push_time() {
    bounded(|| {
        let shape = [2, 3];
        for ty in STORE_TYPES {
            for dtype in [DType::I32, DType::I64] {
                let what = format!("{ty} {dtype}");
                let kv = create(ty).unwrap();
                kv.init([3, 4], &[NDArray::full_with(shape, 5.0, dtype, Context::cpu(0)), NDArray::zeros(shape)]).unwrap();
                // without an optimizer an integer key is pushed as usual
                kv.push(3, &NDArray::full_with(shape, 6.0, dtype, Context::cpu(0))).unwrap();
                kv.set_optimizer(Optimizer::sgd().with_learning_rate(0.1)).unwrap();
                let g = NDArray::full_with(shape, 1.0, dtype, Context::cpu(0));
                let f = NDArray::ones(shape);
                for (op, res) in [
                    ("push", kv.push(3, &g)),
                    ("push", kv.push([3, 4], vec![&g, &f])),
                    ("pushpull", kv.pushpull(3, &g, &NDArray::zeros_with(shape, dtype, Context::cpu(0)))),
                ] {
                    let e = store_err(res, &format!("{what}: {op}"));
                    assert!(matches!(&e, StoreError::Unsupported { op: o, .. } if *o == op), "{what}: {e:?}");
                    assert_msg(&e, &["key 3", dtype.name(), "float keys only"]);
                }
                assert_eq!(pulled::<f64>(&kv, &Key::Int(3), &shape), vec![6.0; 6], "{what}: the integer key is unchanged");
                assert_eq!(pulled::<f32>(&kv, &Key::Int(4), &shape), vec![0.0; 6], "{what}: the list push changed nothing");
                kv.push(4, &f).unwrap();
                assert_eq!(pulled::<f32>(&kv, &Key::Int(4), &shape), vec![-0.1f32; 6], "{what}: the float key is updated");
                kv.clear_updater();
                kv.push(3, &g).unwrap();
                assert_eq!(pulled::<f64>(&kv, &Key::Int(3), &shape), vec![1.0; 6], "{what}: assign works again");
            }
        }
    });
}

// ---- f16 / bf16 weights, multi-precision (K6.11, K6.15) ----

// f16 and bf16 keys with multi_precision: the store keeps an f32 master copy and gives the same
// bits as the updater run directly on a low-precision weight.
#[test]
fn low_precision_weights_with_multi_precision_match_the_updater() {
    bounded(|| {
        let shape = [8, 8];
        let n = size(&shape);
        for ty in STORE_TYPES {
            for mp in [true, false] {
                let opt = Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }).with_learning_rate(0.05).with_multi_precision(mp);
                let mut rng = Rng::new(16);
                let w0 = rng.uniform(n, -1.0, 1.0);
                // f16
                let mut w16: Vec<f16> = w0.iter().map(|&x| f16::from_f32(x)).collect();
                let kv = create(ty).unwrap();
                kv.init(3, &arr_on(&shape, w16.clone(), Context::cpu(0))).unwrap();
                kv.set_optimizer(opt.clone()).unwrap();
                let mut upd = Updater::try_new(opt.clone()).unwrap();
                for step in 0..4 {
                    let g: Vec<f16> = rng.uniform(n, -1.0, 1.0).into_iter().map(f16::from_f32).collect();
                    kv.push(3, &arr_on(&shape, g.clone(), Context::cpu(0))).unwrap();
                    upd.update("3", WeightMut::F16(&mut w16), GradRef::F16(&g)).unwrap();
                    let got = pulled::<f16>(&kv, &Key::Int(3), &shape);
                    assert_same_bits(&got, &w16, |x| u64::from(x.to_bits()), &format!("{ty} f16 mp={mp} step {step}"));
                }
                assert_eq!(upd.state("3").and_then(|s| s.master_weight()).is_some(), mp, "master copy iff multi_precision");
                // bf16
                let mut wb: Vec<bf16> = w0.iter().map(|&x| bf16::from_f32(x)).collect();
                let kv = create(ty).unwrap();
                kv.init("b", &arr_on(&shape, wb.clone(), Context::cpu(0))).unwrap();
                kv.set_optimizer(opt.clone()).unwrap();
                let mut upd = Updater::try_new(opt.clone()).unwrap();
                for step in 0..4 {
                    let g: Vec<bf16> = rng.uniform(n, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
                    kv.push("b", &arr_on(&shape, g.clone(), Context::cpu(0))).unwrap();
                    upd.update("b", WeightMut::BF16(&mut wb), GradRef::BF16(&g)).unwrap();
                    let got = pulled::<bf16>(&kv, &Key::from("b"), &shape);
                    assert_same_bits(&got, &wb, |x| u64::from(x.to_bits()), &format!("{ty} bf16 mp={mp} step {step}"));
                }
            }
        }
    });
}

// Why multi-precision matters, in numbers: ten SGD steps of lr·g = 1.0002e-4 on an f16 weight of
// 1. Each step alone is below half an f16 ulp at 1 (2^-11), so without a master copy the weight
// stays 1; the f32 master reaches 0.9990, which rounds to the f16 value 1 − 2^-10.
#[test]
fn multi_precision_accumulates_updates_below_f16_resolution() {
    bounded(|| {
        let shape = [4];
        for ty in STORE_TYPES {
            for (mp, expected) in [(true, 1.0 - 1.0 / 1024.0), (false, 1.0)] {
                let kv = create(ty).unwrap();
                kv.init(3, &NDArray::full_with(shape, 1.0, DType::F16, Context::cpu(0))).unwrap();
                kv.set_optimizer(Optimizer::sgd().with_learning_rate(1.0).with_multi_precision(mp)).unwrap();
                let g = NDArray::full_with(shape, 1e-4, DType::F16, Context::cpu(0));
                for _ in 0..10 {
                    kv.push(3, &g).unwrap();
                }
                let got = pulled::<f16>(&kv, &Key::Int(3), &shape);
                assert_eq!(got, vec![f16::from_f64(expected); 4], "{ty} multi_precision={mp}");
            }
        }
    });
}

// ---- asynchronous failures of the optimizer ----

// States loaded from a file whose key has another element count fit the optimizer, so the load
// succeeds; the key's next update fails (docs/optimizer-states.md: "reported by that key's next
// update; the update is not applied and not counted"). The failure is reported to the next pull
// of the key and by wait_all, the key keeps its value, and the other keys of the same push are
// still updated — as a failing custom updater does (store_errors.rs,
// a_failing_key_does_not_block_the_other_keys_of_the_push; local.rs: "with an updater every key
// gets its own operation").
#[test]
fn a_state_that_does_not_fit_fails_only_its_own_key() {
    bounded(|| {
        let _turn = async_turn();
        for ty in STORE_TYPES {
            // the bad key first (3 < 5) and last (7 > 5) in the push order
            for bad in [3, 7] {
                let what = format!("{ty}, key {bad} mismatched");
                let kv = create(ty).unwrap();
                let _ = kv.wait_all();
                let opt = Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }).with_learning_rate(0.1);
                // a file whose key `bad` has 9 elements
                let src = create(ty).unwrap();
                src.init(bad, &NDArray::zeros([3, 3])).unwrap();
                src.set_optimizer(opt.clone()).unwrap();
                src.push(bad, &NDArray::ones([3, 3])).unwrap();
                let file = TempFile::new("mismatch");
                src.save_optimizer_states(file.path()).unwrap();

                let shape = [2, 2];
                kv.init([bad, 5], &[NDArray::full(shape, 1.0), NDArray::full(shape, 1.0)]).unwrap();
                kv.set_optimizer(opt.clone()).unwrap();
                kv.load_optimizer_states(file.path()).unwrap_or_else(|e| panic!("{what}: the slots fit, the load succeeds: {e}"));
                let g = NDArray::ones(shape);
                kv.push([bad, 5], vec![&g, &g]).expect("the push itself is valid");

                let out = NDArray::zeros(shape);
                kv.pull(bad, &out).unwrap();
                match out.wait_to_read() {
                    Err(synkv::ndarray::Error::Engine(engine::Error::Failed { op: "push", source })) => {
                        let inner = source.downcast_ref::<Error>().unwrap_or_else(|| panic!("{what}: a synkv::Error inside: {source:?}"));
                        assert!(
                            matches!(inner, Error::Optimizer(optimizer::Error::StateMismatch { key, .. }) if *key == bad.to_string()),
                            "{what}: {inner:?}"
                        );
                        assert_msg(inner, &[&format!("key {bad}"), "9 elements", "4"]);
                    }
                    other => panic!("{what}: the pull of the failed key should report the failure, got {other:?}"),
                }
                // key 5 had no state in the file: a fresh first SGD step, 1 − 0.1·1
                let five = NDArray::zeros(shape);
                kv.pull(5, &five).unwrap();
                let five_first = five.to_vec::<f32>();
                let _ = kv.wait_all();
                assert_eq!(pulled::<f32>(&kv, &Key::Int(bad), &shape), vec![1.0; 4], "{what}: the failed key keeps its value");
                let five_later = pulled::<f32>(&kv, &Key::Int(5), &shape);
                match five_first {
                    Ok(v) => assert_eq!(v, vec![0.9; 4], "{what}: key 5 is updated"),
                    Err(e) => panic!(
                        "{what}: the pull of key 5, pushed in the same call, reports key {bad}'s failure ({e}); \
                         key 5 holds {five_later:?} afterwards (expected 0.9 everywhere)"
                    ),
                }
                assert_eq!(five_later, vec![0.9; 4], "{what}: key 5 is updated");
                kv.wait_all().unwrap_or_else(|e| panic!("{what}: reported twice: {e}"));
            }
        }
    });
}

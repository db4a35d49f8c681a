//! row_sparse values through the `local` and `device` stores (spec K4.2–K4.3, K5.8–K5.15, K3.6,
//! K6.11, K12.25) with upstream's cases and numbers: `row_sparse_pull` (T2, T18, T19, T20 and the
//! Perl test's cases, T36), the sparse aggregator (T7), invalid pulls (T10), row_sparse pushes
//! into dense keys, and sparse gradients on dense weights under an optimizer, compared with
//! `optimizer::Updater::update_row_sparse` run directly.
//!
//! Random values are seeded. Values summed across devices are multiples of 1/64 in [-1, 1), so
//! their f32 sums are exact in any order and "Σ outputs = 4·Σ inputs" can be checked exactly.

mod common;

use std::collections::BTreeSet;
use std::fmt::{Debug, Display};
use std::sync::{Arc, Mutex, MutexGuard};

use common::{bounded, with_timeout, STORE_TYPES};
use synkv::ndarray::{Buffer, BufferElement};
use synkv::optimizer::{AdaGrad, Adam, Ftrl, GradRef, Optimizer, Sgd, Updater, WeightMut};
use synkv::store::{Error as StoreError, PullOptions};
use synkv::{create, engine, Context, DType, Error, KVStore, Key, NDArray, StorageType};

// ---- helpers ----

/// SplitMix64: a small seeded generator.
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

    /// An integer in `[0, n)`.
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// A value uniform in `[-1, 1)`.
    fn uniform(&mut self) -> f32 {
        -1.0 + 2.0 * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }

    /// A multiple of 1/64 in `[-1, 1)`, never 0 (so a stored row is a non-zero row).
    fn dyadic(&mut self) -> f32 {
        let k = (self.next_u64() % 127) as i32 - 63;
        (if k >= 0 { k + 1 } else { k }) as f32 / 64.0
    }
}

/// A row_sparse f32 array of `shape` holding the rows `ids` (sorted, unique) with `data`.
fn rsp(shape: &[usize], ids: Vec<i64>, data: Vec<f32>, ctx: Context) -> NDArray {
    NDArray::row_sparse(shape.to_vec(), ids, Buffer::from_vec(data), ctx).expect("a valid row_sparse array")
}

/// A row_sparse array with every row present and every element `value`
/// (MXNet's `(ones(shape) * value).tostype('row_sparse')`).
fn rsp_full(shape: &[usize], value: f32, ctx: Context) -> NDArray {
    rsp(shape, (0..shape[0] as i64).collect(), vec![value; shape.iter().product()], ctx)
}

/// A random row_sparse array: each row present with probability 1/2, values dyadic or uniform.
fn rand_rsp(rng: &mut Rng, shape: &[usize], dyadic: bool, ctx: Context) -> NDArray {
    let mut ids = Vec::new();
    let mut data = Vec::new();
    for r in 0..shape[0] {
        if rng.below(2) == 0 {
            ids.push(r as i64);
            for _ in 0..shape[1] {
                data.push(if dyadic { rng.dyadic() } else { rng.uniform() });
            }
        }
    }
    rsp(shape, ids, data, ctx)
}

/// A dense array of `data` (any element type) on `cpu(0)`.
fn dense<T: BufferElement>(shape: &[usize], data: Vec<T>) -> NDArray {
    NDArray::from_buffer(shape.to_vec(), Buffer::from_vec(data), Context::cpu(0)).expect("data fits the shape")
}

/// Row ids as an f32 array (upstream's `mx.nd.array(row_id)`), of shape `shape`.
fn ids_f32(shape: &[usize], ids: &[i64]) -> NDArray {
    dense(shape, ids.iter().map(|&i| i as f32).collect())
}

/// `0..n` as an int64 array (`mx.nd.arange(0, n, dtype='int64')`).
fn arange_i64(n: usize) -> NDArray {
    dense(&[n], (0..n as i64).collect())
}

/// The dense elements of `a` as f32.
#[track_caller]
fn values(a: &NDArray, what: &str) -> Vec<f32> {
    a.to_vec::<f32>().unwrap_or_else(|e| panic!("{what}: reading the array failed: {e}"))
}

/// The stored row ids of a row_sparse array.
#[track_caller]
fn indices(a: &NDArray, what: &str) -> Vec<i64> {
    a.indices().unwrap_or_else(|e| panic!("{what}: reading the row ids failed: {e}"))
}

/// Sorted unique ids (what K5.10 says the store uses).
fn unique(ids: &[i64]) -> Vec<i64> {
    ids.iter().copied().collect::<BTreeSet<i64>>().into_iter().collect()
}

/// Asserts that the row_sparse output `out` holds exactly the rows `requested` (sorted unique
/// ids), each row equal to `row_value(r)`, and zeros elsewhere.
#[track_caller]
fn assert_rows(out: &NDArray, requested: &[i64], row_value: impl Fn(usize) -> Vec<f32>, what: &str) {
    assert_eq!(out.storage_type(), StorageType::RowSparse, "{what}: the output stays row_sparse");
    assert_eq!(indices(out, what), requested, "{what}: the output's row ids are the sorted unique requested ids");
    let rows = out.shape().rows();
    let row_len = out.shape().row_len();
    let got = values(out, what);
    for r in 0..rows {
        let expected = if requested.contains(&(r as i64)) { row_value(r) } else { vec![0.0; row_len] };
        assert_eq!(&got[r * row_len..(r + 1) * row_len], expected.as_slice(), "{what}: row {r} (requested {requested:?})");
    }
}

/// The store error inside `res`, or a panic saying what came instead.
#[track_caller]
fn store_err<T: Debug>(res: synkv::Result<T>, what: &str) -> StoreError {
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

/// Element-wise sum of the dense forms of `arrays`, in f64.
fn dense_sum(arrays: &[NDArray]) -> Vec<f64> {
    let mut sum = vec![0.0; arrays[0].size()];
    for a in arrays {
        for (s, v) in sum.iter_mut().zip(a.to_vec::<f64>().unwrap()) {
            *s += v;
        }
    }
    sum
}

/// `wait_all` reports the first error raised anywhere in the process since the last one, so
/// tests that raise asynchronous errors or call `wait_all` take turns.
static ASYNC_ERRORS: Mutex<()> = Mutex::new(());

fn async_turn() -> MutexGuard<'static, ()> {
    ASYNC_ERRORS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Upstream's default shape.
const SHAPE: [usize; 2] = [4, 4];

// ---- row_sparse_pull ----

/// T2 / Perl `test_row_sparse_pull` (T36): 'e' holds ones in every row; for 1 and 4 outputs,
/// each with 4 random row ids in [0, 4) shaped (2, 2) as float32: requested rows are 1, the
/// others 0, and each output's row ids are the sorted unique requested ids.
fn check_row_sparse_pull(kv: &KVStore, count: usize, rng: &mut Rng, what: &str) {
    let outs: Vec<NDArray> = (0..count).map(|_| NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0))).collect();
    let ids: Vec<Vec<i64>> = (0..count).map(|_| (0..4).map(|_| rng.below(4) as i64).collect()).collect();
    let id_arrays: Vec<NDArray> = ids.iter().map(|i| ids_f32(&[2, 2], i)).collect();
    if count == 1 {
        kv.row_sparse_pull("e", &outs[0], &id_arrays[0]).unwrap();
    } else {
        kv.row_sparse_pull("e", &outs, id_arrays.iter().collect::<Vec<&NDArray>>()).unwrap();
    }
    for (i, (out, id)) in outs.iter().zip(&ids).enumerate() {
        assert_rows(out, &unique(id), |_| vec![1.0; 4], &format!("{what}: {count} outputs, output {i}, ids {id:?}"));
    }
}

#[test]
fn t2_row_sparse_pull_random_row_ids() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init("e", &rsp_full(&SHAPE, 1.0, Context::cpu(0))).unwrap();
            let mut rng = Rng::new(2);
            // several draws, so that duplicates, gaps and full sets all occur
            for round in 0..8 {
                for count in [1, 4] {
                    check_row_sparse_pull(&kv, count, &mut rng, &format!("{ty} round {round}"));
                }
            }
        }
    });
}

// The Perl test (T36, 1.9.1 t/test_kvstore.t) `test_row_sparse_pull` on the default store:
// 4 + 16 row checks of "requested rows 1, others 0".
#[test]
fn t36_perl_row_sparse_pull() {
    bounded(|| {
        let kv = create("local").unwrap();
        kv.init("e", &rsp_full(&SHAPE, 1.0, Context::cpu(0))).unwrap();
        let mut rng = Rng::new(36);
        check_row_sparse_pull(&kv, 1, &mut rng, "Perl");
        check_row_sparse_pull(&kv, 4, &mut rng, "Perl");
    });
}

// K5.10 / K5.11: row ids of any numeric dtype and shape, unsorted, repeated or empty; the docs'
// examples; rows the key does not hold come back as zeros; the output is replaced, not merged.
#[test]
fn row_ids_any_dtype_order_duplicates_and_empty() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            // 'v': 5 rows of 3, row r = r + 1 everywhere
            let shape = [5, 3];
            let data: Vec<f32> = (0..15).map(|i| (i / 3 + 1) as f32).collect();
            kv.init("v", &rsp(&shape, (0..5).collect(), data, Context::cpu(0))).unwrap();
            let row = |r: usize| vec![(r + 1) as f32; 3];
            let cases: Vec<(&str, NDArray, Vec<i64>)> = vec![
                ("i64 unsorted with repeats", dense(&[4], vec![3i64, 1, 3, 0]), vec![0, 1, 3]),
                ("f64 (2, 2)", dense(&[2, 2], vec![4.0f64, 4.0, 2.0, 2.0]), vec![2, 4]),
                ("i32", dense(&[2], vec![4i32, 0]), vec![0, 4]),
                ("f32 (2, 3) all rows", dense(&[2, 3], vec![4.0f32, 3.0, 2.0, 1.0, 0.0, 0.0]), vec![0, 1, 2, 3, 4]),
                ("one id", dense(&[1], vec![2i64]), vec![2]),
            ];
            for (case, ids, expected) in cases {
                let what = format!("{ty} {case}");
                let out = NDArray::row_sparse_zeros(shape, DType::F32, Context::cpu(0));
                kv.row_sparse_pull("v", &out, &ids).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_rows(&out, &expected, row, &what);
            }

            // an output holding other rows is replaced by the pull, not merged with it
            let out = rsp(&shape, vec![0, 4], vec![9.0; 6], Context::cpu(0));
            kv.row_sparse_pull("v", &out, &dense(&[1], vec![2i64])).unwrap();
            assert_rows(&out, &[2], row, &format!("{ty}: a non-empty output is replaced"));

            // empty row ids: an all-zero output with no rows (dist test: pull with [] → 0)
            let out = rsp(&shape, vec![1], vec![9.0; 3], Context::cpu(0));
            kv.row_sparse_pull("v", &out, &dense(&[0], Vec::<f32>::new())).unwrap();
            assert_rows(&out, &[], row, &format!("{ty}: empty row ids"));
            assert_eq!(values(&out, ty), vec![0.0; 15]);

            // an f64 output receives the rows converted
            let out = NDArray::row_sparse_zeros(shape, DType::F64, Context::cpu(0));
            kv.row_sparse_pull("v", &out, &dense(&[2], vec![1i64, 3])).unwrap();
            assert_eq!(out.to_vec::<f64>().unwrap(), [vec![0.0; 3], vec![2.0; 3], vec![0.0; 3], vec![4.0; 3], vec![0.0; 3]].concat());
            assert_eq!(indices(&out, ty), vec![1, 3]);

            // the docs' examples on an all-ones 3×3 key
            kv.init("ones", &rsp_full(&[3, 3], 1.0, Context::cpu(0))).unwrap();
            for (ids, expected) in [(vec![0i64, 2], vec![0i64, 2]), (vec![2, 2], vec![2]), (vec![1, 0], vec![0, 1])] {
                let out = NDArray::row_sparse_zeros([3, 3], DType::F32, Context::cpu(0));
                kv.row_sparse_pull("ones", &out, &ids_f32(&[ids.len()], &ids)).unwrap();
                assert_rows(&out, &expected, |_| vec![1.0; 3], &format!("{ty}: docs example {ids:?}"));
            }

            // a key holding only rows 1 and 3: requested rows it lacks are zeros, but listed
            kv.init("part", &rsp(&SHAPE, vec![1, 3], vec![5.0; 8], Context::cpu(0))).unwrap();
            let out = NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0));
            kv.row_sparse_pull("part", &out, &arange_i64(4)).unwrap();
            assert_rows(&out, &[0, 1, 2, 3], |r| vec![if r % 2 == 1 { 5.0 } else { 0.0 }; 4], &format!("{ty}: rows not held"));
        }
    });
}

// K5.8: one row-id array for several outputs of one key; one per output; several keys; a list
// of lists. A row-id list whose length is neither 1 nor the number of outputs is refused.
#[test]
fn row_id_arrays_for_lists_of_outputs_and_keys() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(["e", "f"], &[rsp_full(&SHAPE, 1.0, Context::cpu(0)), rsp_full(&SHAPE, 3.0, Context::cpu(0))]).unwrap();
            let out4 = || (0..4).map(|d| NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(d))).collect::<Vec<_>>();

            // one array for four outputs on four devices
            let outs = out4();
            kv.row_sparse_pull("e", &outs, &ids_f32(&[2, 2], &[3, 0, 3, 3])).unwrap();
            for (d, o) in outs.iter().enumerate() {
                assert_rows(o, &[0, 3], |_| vec![1.0; 4], &format!("{ty}: shared ids, output {d}"));
                assert_eq!(o.context(), Context::cpu(d));
            }

            // several keys, one output and one id array each
            let (a, b) = (
                NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0)),
                NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(1)),
            );
            let (ia, ib) = (ids_f32(&[1], &[1]), ids_f32(&[2], &[2, 0]));
            kv.row_sparse_pull(["e", "f"], vec![&a, &b], vec![&ia, &ib]).unwrap();
            assert_rows(&a, &[1], |_| vec![1.0; 4], &format!("{ty}: key e"));
            assert_rows(&b, &[0, 2], |_| vec![3.0; 4], &format!("{ty}: key f"));

            // a list of lists: two outputs of e, one of f, an id array each
            let (a1, a2, b1) = (
                NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0)),
                NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(1)),
                NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0)),
            );
            let (i1, i2, i3) = (ids_f32(&[1], &[0]), ids_f32(&[1], &[1]), ids_f32(&[1], &[3]));
            kv.row_sparse_pull(["e", "f"], vec![vec![&a1, &a2], vec![&b1]], vec![vec![&i1, &i2], vec![&i3]]).unwrap();
            assert_rows(&a1, &[0], |_| vec![1.0; 4], &format!("{ty}: e, first output"));
            assert_rows(&a2, &[1], |_| vec![1.0; 4], &format!("{ty}: e, second output"));
            assert_rows(&b1, &[3], |_| vec![3.0; 4], &format!("{ty}: f"));

            // four outputs with two id arrays: refused, nothing written
            let outs = out4();
            let (x, y) = (ids_f32(&[1], &[0]), ids_f32(&[1], &[1]));
            let e = store_err(kv.row_sparse_pull("e", &outs, vec![&x, &y]), &format!("{ty}: 4 outputs, 2 id arrays"));
            assert!(matches!(e, StoreError::RowIdsMismatch { outputs: 4, row_ids: 2 }), "{ty}: {e:?}");
            for o in &outs {
                assert_eq!(indices(o, ty), Vec::<i64>::new(), "{ty}: a refused call writes no output");
            }
        }
    });
}

// ---- the sparse aggregator: T7 and the Perl test (T36) ----

/// Pushes 4 random row_sparse values (one per device) to `single` and checks that every way of
/// reading the key gives each output the sum: `row_sparse_pull` of all rows into the pushed
/// arrays themselves (upstream), `pull(ignore_sparse = false)` into fresh row_sparse and dense
/// outputs (T7); Σ outputs = 4·Σ inputs. Then the list form: the same 4 arrays pushed to every key
/// of `list`, and pulled back into them, one row-id array per output.
fn sparse_aggregator(kv: &KVStore, single: &str, list: &[&str], pull_modes: bool, rng: &mut Rng, what: &str) {
    const DEVS: usize = 4;
    let all_rows = ids_f32(&[SHAPE[0]], &[0, 1, 2, 3]);

    let vals: Vec<NDArray> = (0..DEVS).map(|d| rand_rsp(rng, &SHAPE, true, Context::cpu(d))).collect();
    let expected_sum = dense_sum(&vals);
    kv.push(single, &vals).unwrap();
    if pull_modes {
        // pull with ignore_sparse = false: row_sparse and dense outputs get the sum
        let rsp_outs: Vec<NDArray> = (0..DEVS).map(|d| NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(d))).collect();
        let dense_outs: Vec<NDArray> = (0..DEVS).map(|d| NDArray::zeros_on(SHAPE, Context::cpu(d))).collect();
        let all: Vec<&NDArray> = rsp_outs.iter().chain(&dense_outs).collect();
        let report = kv.pull_with(single, all, PullOptions { priority: 0, ignore_sparse: false }).unwrap();
        assert!(report.is_complete(), "{what}: nothing skipped with ignore_sparse = false");
        for (i, o) in rsp_outs.iter().chain(&dense_outs).enumerate() {
            let got: Vec<f64> = o.to_vec::<f64>().unwrap();
            assert_eq!(got, expected_sum, "{what}: pull(ignore_sparse = false) output {i} is the sum");
        }
        for o in &rsp_outs {
            assert_eq!(indices(o, what), vec![0, 1, 2, 3], "{what}: a full pull writes every row");
        }
        let result_sum = dense_sum(&rsp_outs.iter().chain(&dense_outs).cloned().collect::<Vec<_>>());
        assert_eq!(result_sum, expected_sum.iter().map(|x| x * 8.0).collect::<Vec<_>>(), "{what}: Σ of 8 outputs");
    }
    // upstream: row_sparse_pull of all rows back into the pushed arrays
    kv.row_sparse_pull(single, &vals, vec![&all_rows; DEVS]).unwrap();
    let result_sum = dense_sum(&vals);
    assert_eq!(result_sum, expected_sum.iter().map(|x| x * DEVS as f64).collect::<Vec<_>>(), "{what}: Σ outputs = 4·Σ inputs");
    for v in &vals {
        assert_eq!(v.to_vec::<f64>().unwrap(), expected_sum, "{what}: each output is the sum");
        assert_eq!(indices(v, what), vec![0, 1, 2, 3]);
    }

    // list: the same 4 arrays for every key
    let vals: Vec<NDArray> = (0..DEVS).map(|d| rand_rsp(rng, &SHAPE, true, Context::cpu(d))).collect();
    let expected_sum = dense_sum(&vals);
    let lists: Vec<Vec<NDArray>> = list.iter().map(|_| vals.clone()).collect();
    kv.push(list, &lists).unwrap();
    let row_ids: Vec<Vec<&NDArray>> = list.iter().map(|_| vec![&all_rows; DEVS]).collect();
    kv.row_sparse_pull(list, &lists, row_ids).unwrap();
    for (k, vv) in list.iter().zip(&lists) {
        let result_sum = dense_sum(vv);
        assert_eq!(result_sum, expected_sum.iter().map(|x| x * DEVS as f64).collect::<Vec<_>>(), "{what}: key {k}: Σ = 4·Σ inputs");
    }
}

// T7 test_sparse_aggregator (upstream skips it, #18098): str keys 'a' and ['b', 'c', 'd']
// initialised with row_sparse zeros.
#[test]
fn t7_sparse_aggregator() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init("a", &NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0))).unwrap();
            let zeros: Vec<NDArray> = (0..3).map(|_| NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0))).collect();
            kv.init(["b", "c", "d"], &zeros).unwrap();
            let mut rng = Rng::new(7);
            for round in 0..4 {
                sparse_aggregator(&kv, "a", &["b", "c", "d"], true, &mut rng, &format!("{ty} T7 round {round}"));
            }
        }
    });
}

// The same with values that are not exact in f32 sums: within upstream's almost_equal.
#[test]
fn t7_sparse_aggregator_with_uniform_values() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init("a", &NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0))).unwrap();
            let mut rng = Rng::new(77);
            let vals: Vec<NDArray> = (0..4).map(|d| rand_rsp(&mut rng, &SHAPE, false, Context::cpu(d))).collect();
            let expected = dense_sum(&vals);
            kv.push("a", &vals).unwrap();
            let all = ids_f32(&[4], &[0, 1, 2, 3]);
            kv.row_sparse_pull("a", &vals, &all).unwrap();
            let got = dense_sum(&vals);
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert!((g - 4.0 * e).abs() <= 1e-5 * (1.0 + e.abs()), "{ty}: element {i}: Σ outputs {g}, 4·Σ inputs {}", 4.0 * e);
            }
        }
    });
}

// The Perl test's (T36) test_sparse_aggregator: Perl keys are strings ('a' and '5', '7', '9'),
// initialised with row_sparse zeros; row_sparse_pull into the pushed arrays with one all-rows id
// array per output. (Perl creates the store as `create('row_sparse')`, which MXNet's substring
// matching makes a local store, K0.2; synkv refuses unknown names by design, difference 8 in
// docs/mxnet-differences.md, so this runs on `local` and `device`.)
#[test]
fn t36_perl_sparse_aggregator() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init("a", &NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0))).unwrap();
            let zeros: Vec<NDArray> = (0..3).map(|_| NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0))).collect();
            kv.init(["5", "7", "9"], &zeros).unwrap();
            let mut rng = Rng::new(3636);
            sparse_aggregator(&kv, "a", &["5", "7", "9"], false, &mut rng, &format!("{ty} Perl"));
        }
        assert!(create("row_sparse").is_err(), "synkv refuses the Perl test's store name");
    });
}

// ---- invalid pulls (T10) ----

/// Captures the WARN-or-above events emitted on this thread while `f` runs.
fn warnings_during(f: impl FnOnce()) -> Vec<String> {
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    struct Capture(Arc<Mutex<Vec<String>>>);
    struct Message(String);
    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
            self.0.push_str(&format!("{}={value:?} ", field.name()));
        }
    }
    impl Subscriber for Capture {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            *metadata.level() <= Level::WARN
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0.lock().unwrap().push(m.0);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::with_default(Capture(Arc::clone(&seen)), f);
    let out = seen.lock().unwrap().clone();
    out
}

// T10 (a) and K12.25: a pull into row_sparse outputs with the default ignore_sparse leaves them
// unchanged (2 stays 2); synkv reports the skipped keys in PullReport::skipped_sparse (each key
// once) and `pull` logs a warning (difference 6 in docs/mxnet-differences.md).
#[test]
fn t10_pull_into_row_sparse_outputs_is_skipped_and_reported() {
    bounded(|| {
        for ty in STORE_TYPES {
            // upstream's int store (dense keys) and str store, plus a row_sparse key
            for (single, list) in [
                (vec![Key::Int(3)], vec![Key::Int(5), Key::Int(7), Key::Int(11)]),
                (vec![Key::from("a")], vec![Key::from("b"), Key::from("c"), Key::from("d")]),
            ] {
                let kv = create(ty).unwrap();
                let zeros: Vec<NDArray> = (0..4).map(|_| NDArray::zeros(SHAPE)).collect();
                let keys: Vec<Key> = single.iter().chain(&list).cloned().collect();
                kv.init(&keys, &zeros).unwrap();
                let two = || rsp_full(&SHAPE, 2.0, Context::cpu(0));

                // single
                let out = two();
                let report = kv.pull_with(&single[0], &out, PullOptions::default()).unwrap();
                assert_eq!(report.skipped_sparse, single, "{ty}: the skipped key is reported");
                assert!(!report.is_complete());
                assert_eq!(values(&out, ty), vec![2.0; 16], "{ty}: T10(a) the output keeps 2");
                assert_eq!(indices(&out, ty), vec![0, 1, 2, 3]);
                let warnings = warnings_during(|| kv.pull(&single[0], &out).unwrap());
                assert!(
                    warnings.iter().any(|w| w.contains("row_sparse_pull") && w.contains(&single[0].to_string())),
                    "{ty}: pull logs a warning naming the key: {warnings:?}"
                );
                assert_eq!(values(&out, ty), vec![2.0; 16], "{ty}: plain pull skips too");

                // list: two sparse outputs of one key, a dense output of another, a sparse one of a third
                let (s1, s2, d, s3) = (two(), two(), NDArray::full(SHAPE, 9.0), two());
                let pulled = vec![list[0].clone(), list[0].clone(), list[1].clone(), list[2].clone()];
                let report = kv.pull_with(&pulled, vec![&s1, &s2, &d, &s3], PullOptions::default()).unwrap();
                let mut skipped = report.skipped_sparse.clone();
                let mut expected = vec![list[0].clone(), list[2].clone()];
                skipped.sort_by_key(|k| k.to_string());
                expected.sort_by_key(|k| k.to_string());
                assert_eq!(skipped, expected, "{ty}: each key with a skipped output, once");
                for o in [&s1, &s2, &s3] {
                    assert_eq!(values(o, ty), vec![2.0; 16], "{ty}: skipped outputs keep 2");
                }
                assert_eq!(values(&d, ty), vec![0.0; 16], "{ty}: the dense output is written");

                // pushpull = push + pull(ignore_sparse = true) (K5.2): the row_sparse output is skipped
                let out = two();
                kv.pushpull(&single[0], &NDArray::full(SHAPE, 4.0), &out).unwrap();
                assert_eq!(values(&out, ty), vec![2.0; 16], "{ty}: pushpull skips a row_sparse output");
                let check = NDArray::zeros(SHAPE);
                kv.pull(&single[0], &check).unwrap();
                assert_eq!(values(&check, ty), vec![4.0; 16], "{ty}: the push half of the pushpull happened");
            }
        }
    });
}

// T10 (b) and K5.9: row_sparse_pull into dense outputs (single and list), of a dense key, with an
// output of another shape, an out-of-range row id or an uninitialised key: typed errors, nothing
// written, and the store keeps working.
#[test]
fn t10_invalid_row_sparse_pulls() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(["e", "f"], &[rsp_full(&SHAPE, 1.0, Context::cpu(0)), rsp_full(&SHAPE, 1.0, Context::cpu(0))]).unwrap();
            kv.init("dense", &NDArray::ones(SHAPE)).unwrap();
            let one = ids_f32(&[1], &[1]);
            let fresh = || rsp(&SHAPE, vec![0], vec![7.0; 4], Context::cpu(0));

            // a dense output, single (upstream: ones·2 with row_ids [1])
            let d = NDArray::full(SHAPE, 2.0);
            let e = store_err(kv.row_sparse_pull("e", &d, &one), &format!("{ty}: dense output"));
            assert!(
                matches!(&e, StoreError::UnsupportedStorage { op: "row_sparse_pull", stype: StorageType::Dense, key, .. } if *key == Key::from("e")),
                "{ty}: {e:?}"
            );
            assert_msg(&e, &["key e", "row_sparse outputs", "row_sparse_zeros"]);
            assert_eq!(values(&d, ty), vec![2.0; 16], "{ty}: the dense output is untouched");

            // a list of dense outputs, one id array each (upstream), and a list mixing a valid one
            let ds = [NDArray::full(SHAPE, 2.0), NDArray::full(SHAPE, 2.0)];
            let e = store_err(kv.row_sparse_pull(["e", "f"], &ds, vec![&one, &one]), &format!("{ty}: dense outputs"));
            assert!(matches!(&e, StoreError::UnsupportedStorage { stype: StorageType::Dense, .. }), "{ty}: {e:?}");
            let good = fresh();
            let e = store_err(kv.row_sparse_pull(["e", "f"], vec![&good, &ds[1]], vec![&one, &one]), &format!("{ty}: mixed outputs"));
            assert!(matches!(&e, StoreError::UnsupportedStorage { key, .. } if *key == Key::from("f")), "{ty}: {e:?}");
            assert_rows(&good, &[0], |_| vec![7.0; 4], &format!("{ty}: a refused list writes no output"));
            for d in &ds {
                assert_eq!(values(d, ty), vec![2.0; 16]);
            }

            // a dense key (also upstream's case: dense key, dense output)
            let out = fresh();
            let e = store_err(kv.row_sparse_pull("dense", &out, &one), &format!("{ty}: dense key"));
            assert!(
                matches!(&e, StoreError::UnsupportedStorage { stype: StorageType::Dense, key, .. } if *key == Key::from("dense")),
                "{ty}: {e:?}"
            );
            assert_msg(&e, &["key dense", "initialised with a row_sparse value", "pull"]);
            assert!(matches!(store_err(kv.row_sparse_pull("dense", &d, &one), ty), StoreError::UnsupportedStorage { .. }));
            assert_rows(&out, &[0], |_| vec![7.0; 4], &format!("{ty}: untouched"));

            // row ids outside 0..4
            for bad in [4i64, -1, 100] {
                let e = store_err(kv.row_sparse_pull("e", &out, &ids_f32(&[3], &[0, bad, 2])), &format!("{ty}: row id {bad}"));
                match &e {
                    StoreError::RowIdOutOfRange { key, id, rows } => assert_eq!((key, *id, *rows), (&Key::from("e"), bad, 4)),
                    other => panic!("{ty}: row id {bad}: expected RowIdOutOfRange, got {other:?}"),
                }
                assert_msg(&e, &[&format!("row id {bad}"), "key e", "4 rows"]);
            }
            assert_rows(&out, &[0], |_| vec![7.0; 4], &format!("{ty}: untouched by the out-of-range ids"));

            // an output of another shape
            let wrong = NDArray::row_sparse_zeros([4, 5], DType::F32, Context::cpu(0));
            let e = store_err(kv.row_sparse_pull("e", &wrong, &one), &format!("{ty}: (4, 5) output"));
            assert!(matches!(&e, StoreError::ShapeMismatch { op: "row_sparse_pull", .. }), "{ty}: {e:?}");

            // an uninitialised key
            let e = store_err(kv.row_sparse_pull("nope", &out, &one), &format!("{ty}: uninitialised key"));
            assert!(matches!(&e, StoreError::NotInitialized { op: "row_sparse_pull", key } if *key == Key::from("nope")), "{ty}: {e:?}");

            // the store works
            kv.row_sparse_pull("e", &out, &ids_f32(&[2], &[3, 1])).unwrap();
            assert_rows(&out, &[1, 3], |_| vec![1.0; 4], &format!("{ty}: a valid row_sparse_pull after the errors"));
        }
    });
}

// K5.9: row ids must be dense. A row_sparse id array (rows 0 and 2 absent, so its dense form
// [0, 3, 0, 1] would request row 0, which no stored id names) is refused, and the output is left
// as it was.
#[test]
fn row_ids_must_be_dense() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init("e", &rsp_full(&SHAPE, 1.0, Context::cpu(0))).unwrap();
            let out = rsp(&SHAPE, vec![0], vec![7.0; 4], Context::cpu(0));
            let sparse_ids = rsp(&[4, 1], vec![1, 3], vec![3.0, 1.0], Context::cpu(0));
            let res = kv.row_sparse_pull("e", &out, &sparse_ids);
            let got = indices(&out, ty);
            assert!(
                res.is_err(),
                "{ty}: row_sparse_pull accepted row_sparse row ids (K5.9: they must be dense); the output now holds rows {got:?}"
            );
            assert_rows(&out, &[0], |_| vec![7.0; 4], &format!("{ty}: untouched by the refused row ids"));
        }
    });
}

// ---- T18, T19, T20 ----

// T18 test_rsp_push_pull in CPU form: 'e' = row_sparse ones, pushed row_sparse ones from 2
// contexts (stored 2); row_sparse_pull with 1 output, 4 outputs on 4 contexts, 4 outputs with one
// shared id array, and 4 outputs with consecutive slices of one id vector (synkv has no array
// views: the slices are copies) → requested rows 2, others 0; then a full pull with
// ignore_sparse = false → every row 2.
#[test]
fn t18_rsp_push_pull() {
    bounded(|| {
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init("e", &rsp_full(&SHAPE, 1.0, Context::cpu(0))).unwrap();
            let pushed: Vec<NDArray> = (0..2).map(|d| rsp_full(&SHAPE, 1.0, Context::cpu(d))).collect();
            kv.push("e", &pushed).unwrap();
            let mut rng = Rng::new(18);
            let num_rows = SHAPE[0];
            for round in 0..3 {
                for (config, count) in [("1 output", 1), ("4 outputs", 4), ("shared row ids", 4), ("sliced row ids", 4)] {
                    let what = format!("{ty} round {round} {config}");
                    let vals: Vec<NDArray> = (0..count).map(|d| NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(d))).collect();
                    let row_ids: Vec<Vec<i64>> = match config {
                        "shared row ids" => vec![(0..num_rows).map(|_| rng.below(4) as i64).collect(); count],
                        "sliced row ids" => {
                            let total: Vec<i64> = (0..count * num_rows).map(|_| rng.below(4) as i64).collect();
                            total.chunks(num_rows).map(<[i64]>::to_vec).collect()
                        }
                        _ => (0..count).map(|_| (0..num_rows).map(|_| rng.below(4) as i64).collect()).collect(),
                    };
                    let arrays: Vec<NDArray> = row_ids.iter().map(|r| ids_f32(&[num_rows], r)).collect();
                    match config {
                        "1 output" => kv.row_sparse_pull("e", &vals[0], &arrays[0]).unwrap(),
                        "shared row ids" => kv.row_sparse_pull("e", &vals, &arrays[0]).unwrap(),
                        _ => kv.row_sparse_pull("e", &vals, arrays.iter().collect::<Vec<_>>()).unwrap(),
                    }
                    for (i, (v, r)) in vals.iter().zip(&row_ids).enumerate() {
                        assert_rows(v, &unique(r), |_| vec![2.0; 4], &format!("{what}: output {i}"));
                    }
                    let report = kv.pull_with("e", &vals, PullOptions { priority: 0, ignore_sparse: false }).unwrap();
                    assert!(report.is_complete());
                    for (i, v) in vals.iter().enumerate() {
                        assert_rows(v, &[0, 1, 2, 3], |_| vec![2.0; 4], &format!("{what}: full pull, output {i}"));
                    }
                }
            }
        }
    });
}

// T19 test_row_sparse_pull_single_device: push a random row_sparse array, then row_sparse_pull
// with its own indices into the pushed array itself (as upstream does, K5.13) and into a fresh
// output: both equal the original. Once with every row present (upstream's random normal
// `.tostype('row_sparse')`), once with some rows.
#[test]
fn t19_row_sparse_pull_with_its_own_indices() {
    bounded(|| {
        for ty in STORE_TYPES {
            let mut rng = Rng::new(19);
            for (case, grad) in [
                ("every row", {
                    let data: Vec<f32> = (0..16).map(|_| rng.uniform()).collect();
                    rsp(&SHAPE, vec![0, 1, 2, 3], data, Context::cpu(0))
                }),
                ("some rows", rsp(&[6, 4], vec![1, 2, 5], (0..12).map(|_| rng.uniform()).collect(), Context::cpu(0))),
            ] {
                let what = format!("{ty} {case}");
                let copy = values(&grad, &what);
                let idx = indices(&grad, &what);
                let kv = create(ty).unwrap();
                kv.init(0, &grad).unwrap();
                kv.push(0, &grad).unwrap();
                let fresh = NDArray::row_sparse_zeros(grad.shape().clone(), DType::F32, Context::cpu(1));
                let idx_array = dense(&[idx.len()], idx.clone());
                kv.row_sparse_pull(0, &fresh, &idx_array).unwrap();
                kv.row_sparse_pull(0, &grad, &idx_array).unwrap();
                for (which, out) in [("the pushed array", &grad), ("a fresh output", &fresh)] {
                    assert_eq!(values(out, &what), copy, "{what}: {which} equals the original");
                    assert_eq!(indices(out, &what), idx, "{what}: {which} has the original's rows");
                }
            }
        }
    });
}

// T20 test_rsp_push_pull_large_rowid at upstream's size: 793,470 × 1 row_sparse ones (far above
// the big-array bound of 65,536 elements): init, push, row_sparse_pull of every row with int64
// ids → 793,470 row ids and every value right. Then a 2-device push and a strided pull.
#[test]
fn t20_large_row_ids() {
    with_timeout(120, || {
        const NUM_ROWS: usize = 793_470;
        let shape = [NUM_ROWS, 1];
        for ty in STORE_TYPES {
            let val = rsp_full(&shape, 1.0, Context::cpu(0));
            let kv = create(ty).unwrap();
            kv.init("a", &val).unwrap();
            let out = NDArray::row_sparse_zeros(shape, DType::F32, Context::cpu(0));
            kv.push("a", &val).unwrap();
            kv.row_sparse_pull("a", &out, &arange_i64(NUM_ROWS)).unwrap();
            let idx = indices(&out, ty);
            assert_eq!(idx.len(), NUM_ROWS, "{ty}: every row id");
            assert!(idx.iter().enumerate().all(|(i, &r)| r == i as i64), "{ty}: ids 0..{NUM_ROWS} in order");
            assert!(values(&out, ty).iter().all(|&x| x == 1.0), "{ty}: every value 1");

            let two: Vec<NDArray> = (0..2).map(|d| rsp_full(&shape, 1.0, Context::cpu(d))).collect();
            kv.push("a", &two).unwrap();
            let strided: Vec<i64> = (0..NUM_ROWS as i64).rev().step_by(1000).collect();
            kv.row_sparse_pull("a", &out, &dense(&[strided.len()], strided.clone())).unwrap();
            let got = indices(&out, ty);
            assert_eq!(got, unique(&strided), "{ty}: the strided ids, sorted");
            let v = values(&out, ty);
            assert_eq!(v.iter().filter(|&&x| x == 2.0).count(), strided.len(), "{ty}: requested rows are 2");
            assert_eq!(v.iter().filter(|&&x| x == 0.0).count(), NUM_ROWS - strided.len(), "{ty}: the rest 0");
        }
    });
}

// ---- pushes that mix storage types, without updater ----

// A row_sparse push into a dense key without updater: the key stays dense and holds the
// densified sum (assign: rows absent from every pushed value become 0, they do not keep their
// old value). MXNet would make the stored value row_sparse (K3.6); what a pull returns is the
// same. Dense values pushed into a row_sparse key make it hold every row.
#[test]
fn pushes_mixing_storage_types_assign_the_sum() {
    bounded(|| {
        let shape = [4, 3];
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            kv.init(3, &NDArray::full(shape, 5.0)).unwrap();
            kv.init(4, &rsp_full(&shape, 1.0, Context::cpu(0))).unwrap();

            kv.push(3, &rsp(&shape, vec![1, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], Context::cpu(0))).unwrap();
            let out = NDArray::full(shape, -1.0);
            kv.pull(3, &out).unwrap();
            assert_eq!(values(&out, ty), vec![0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 4.0, 5.0, 6.0], "{ty}: densified sum");
            // still a dense key
            let e = store_err(kv.row_sparse_pull(3, &NDArray::row_sparse_zeros(shape, DType::F32, Context::cpu(0)), &arange_i64(4)), ty);
            assert!(matches!(e, StoreError::UnsupportedStorage { stype: StorageType::Dense, .. }), "{ty}: {e:?}");

            // row_sparse values from two devices plus a dense one
            let vals = [
                rsp(&shape, vec![0, 1], vec![1.0; 6], Context::cpu(0)),
                rsp(&shape, vec![1, 2], vec![2.0; 6], Context::cpu(1)),
                NDArray::full_with(shape, 0.5, DType::F32, Context::cpu(2)),
            ];
            kv.push(3, &vals).unwrap();
            kv.pull(3, &out).unwrap();
            assert_eq!(values(&out, ty), [vec![1.5; 3], vec![3.5; 3], vec![2.5; 3], vec![0.5; 3]].concat(), "{ty}: mixed sum");

            // pushpull of a row_sparse value into a dense output
            let pp = NDArray::zeros(shape);
            kv.pushpull(3, &rsp(&shape, vec![2], vec![9.0; 3], Context::cpu(0)), &pp).unwrap();
            assert_eq!(values(&pp, ty), [vec![0.0; 6], vec![9.0; 3], vec![0.0; 3]].concat(), "{ty}: pushpull");

            // a row_sparse key: a row_sparse push replaces the rows (absent rows read as 0) …
            kv.push(4, &rsp(&shape, vec![2], vec![3.0; 3], Context::cpu(0))).unwrap();
            let o = NDArray::row_sparse_zeros(shape, DType::F32, Context::cpu(0));
            kv.row_sparse_pull(4, &o, &arange_i64(4)).unwrap();
            assert_rows(&o, &[0, 1, 2, 3], |r| vec![if r == 2 { 3.0 } else { 0.0 }; 3], &format!("{ty}: row_sparse assign"));
            // … and a dense push gives it every row
            kv.push(4, &NDArray::full(shape, 6.0)).unwrap();
            kv.row_sparse_pull(4, &o, &ids_f32(&[2], &[3, 0])).unwrap();
            assert_rows(&o, &[0, 3], |_| vec![6.0; 3], &format!("{ty}: dense into row_sparse"));
            let d = NDArray::zeros(shape);
            kv.pull(4, &d).unwrap();
            assert_eq!(values(&d, ty), vec![6.0; 12], "{ty}: a dense pull of a row_sparse key");
        }
    });
}

// ---- sparse gradients under an optimizer (K6.11) ----

/// A row_sparse gradient given as (row ids, data).
struct SparseGrad {
    rows: Vec<i64>,
    data: Vec<f32>,
}

// Row_sparse gradients on a dense weight: SGD (with and without momentum) and Adam with
// lazy_update true and false, AdaGrad and FTRL lazy, and an optimizer without a sparse kernel
// (densified) — each equal, bit for bit, to `Updater::update_row_sparse` run directly on the
// merged gradient (single device, two devices with overlapping rows, and an empty gradient).
// Lazy updates leave rows never present in a gradient exactly as initialised; standard updates
// with weight decay change them.
#[test]
fn sparse_gradients_on_dense_weights_match_update_row_sparse() {
    bounded(|| {
        let shape = [6, 3];
        let row_len = 3;
        let cases: Vec<(&str, Optimizer, Option<bool>)> = vec![
            (
                "sgd momentum lazy",
                Optimizer::from(Sgd { momentum: 0.9, lazy_update: true, ..Sgd::default() }).with_learning_rate(0.1).with_wd(0.01),
                Some(true),
            ),
            (
                "sgd momentum standard",
                Optimizer::from(Sgd { momentum: 0.9, lazy_update: false, ..Sgd::default() }).with_learning_rate(0.1).with_wd(0.01),
                Some(false),
            ),
            (
                "sgd lazy",
                Optimizer::from(Sgd { momentum: 0.0, lazy_update: true, ..Sgd::default() }).with_learning_rate(0.1).with_wd(0.01),
                Some(true),
            ),
            (
                "sgd standard",
                Optimizer::from(Sgd { momentum: 0.0, lazy_update: false, ..Sgd::default() }).with_learning_rate(0.1).with_wd(0.01),
                Some(false),
            ),
            (
                "adam lazy",
                Optimizer::from(Adam { lazy_update: true, ..Adam::default() }).with_learning_rate(0.05).with_wd(0.01),
                Some(true),
            ),
            (
                "adam standard",
                Optimizer::from(Adam { lazy_update: false, ..Adam::default() }).with_learning_rate(0.05).with_wd(0.01),
                Some(false),
            ),
            ("adagrad lazy", Optimizer::from(AdaGrad::default()).with_learning_rate(0.1), Some(true)),
            ("ftrl lazy", Optimizer::from(Ftrl::default()), Some(true)),
            ("rmsprop (densified)", Optimizer::rmsprop().with_learning_rate(0.01).with_wd(0.01), None),
        ];
        for ty in STORE_TYPES {
            for (name, opt, lazy) in &cases {
                let what = format!("{ty} {name}");
                let mut rng = Rng::new(611);
                let w0: Vec<f32> = (0..18).map(|_| rng.dyadic()).collect();
                let kv = create(ty).unwrap();
                kv.init("w", &dense(&shape, w0.clone())).unwrap();
                kv.set_optimizer(opt.clone()).unwrap();
                let mut upd = Updater::try_new(opt.clone()).unwrap();
                let mut w = w0.clone();
                // row 5 is in no gradient
                let steps: Vec<Vec<SparseGrad>> = vec![
                    vec![SparseGrad { rows: vec![0, 2], data: (0..6).map(|_| rng.dyadic()).collect() }],
                    vec![
                        SparseGrad { rows: vec![1, 2], data: (0..6).map(|_| rng.dyadic()).collect() },
                        SparseGrad { rows: vec![2, 4], data: (0..6).map(|_| rng.dyadic()).collect() },
                    ],
                    vec![SparseGrad { rows: vec![], data: vec![] }],
                    vec![SparseGrad { rows: vec![0, 1, 3], data: (0..9).map(|_| rng.dyadic()).collect() }],
                ];
                for (s, grads) in steps.iter().enumerate() {
                    let arrays: Vec<NDArray> =
                        grads.iter().enumerate().map(|(d, g)| rsp(&shape, g.rows.clone(), g.data.clone(), Context::cpu(d))).collect();
                    kv.push("w", &arrays).unwrap();
                    // the merged gradient: union of the rows, summed (exact: dyadic values)
                    let rows: Vec<i64> = unique(&grads.iter().flat_map(|g| g.rows.clone()).collect::<Vec<_>>());
                    let mut data = vec![0.0f32; rows.len() * row_len];
                    for g in grads {
                        for (i, r) in g.rows.iter().enumerate() {
                            let pos = rows.iter().position(|x| x == r).unwrap();
                            for c in 0..row_len {
                                data[pos * row_len + c] += g.data[i * row_len + c];
                            }
                        }
                    }
                    upd.update_row_sparse("w", WeightMut::F32(&mut w), row_len, &rows, GradRef::F32(&data)).unwrap();
                    let out = NDArray::zeros(shape);
                    kv.pull("w", &out).unwrap();
                    let got = values(&out, &what);
                    let differ: Vec<usize> = (0..18).filter(|&i| got[i].to_bits() != w[i].to_bits()).collect();
                    assert!(differ.is_empty(), "{what}: step {s}: elements {differ:?} differ: store {got:?}, updater {w:?}");
                }
                let last_row = &w[15..18];
                match lazy {
                    Some(true) => assert_eq!(last_row, &w0[15..18], "{what}: a lazy update never touches row 5"),
                    Some(false) => assert_ne!(last_row, &w0[15..18], "{what}: a standard update decays row 5 too"),
                    None => {}
                }
            }
        }
    });
}

// A row_sparse key holding every row can be updated by an optimizer like a dense key.
#[test]
fn an_optimizer_updates_a_row_sparse_key_with_every_row() {
    bounded(|| {
        let shape = [4, 2];
        for ty in STORE_TYPES {
            let opt = Optimizer::from(Sgd { momentum: 0.5, lazy_update: true, ..Sgd::default() }).with_learning_rate(0.5);
            let kv = create(ty).unwrap();
            kv.init("w", &rsp_full(&shape, 1.0, Context::cpu(0))).unwrap();
            kv.set_optimizer(opt.clone()).unwrap();
            let mut upd = Updater::try_new(opt).unwrap();
            let mut w = vec![1.0f32; 8];
            for (rows, data) in [(vec![1i64, 3], vec![1.0f32, 2.0, 3.0, 4.0]), (vec![0, 1], vec![-1.0, -1.0, 0.5, 0.5])] {
                kv.push("w", &rsp(&shape, rows.clone(), data.clone(), Context::cpu(0))).unwrap();
                upd.update_row_sparse("w", WeightMut::F32(&mut w), 2, &rows, GradRef::F32(&data)).unwrap();
            }
            let out = NDArray::row_sparse_zeros(shape, DType::F32, Context::cpu(0));
            kv.row_sparse_pull("w", &out, &arange_i64(4)).unwrap();
            assert_eq!(values(&out, ty), w, "{ty}: the row_sparse key updated as the updater does");
            assert_eq!(w, vec![1.5, 1.5, 0.0, -0.75, 1.0, 1.0, -0.5, -1.0], "{ty}: hand-computed SGD with momentum 0.5, lr 0.5");
        }
    });
}

// An optimizer refuses a row_sparse key that lacks rows (MXNet: "only implemented for RowSparse
// weights with all rows containing non-zeros"). The key's rows are only known when the update
// runs, so the push is accepted and the failure surfaces on the next pull of the key and from
// wait_all; the key keeps its value and the store keeps working.
#[test]
fn an_optimizer_on_a_row_sparse_key_without_every_row_fails_at_update() {
    bounded(|| {
        let _turn = async_turn();
        for ty in STORE_TYPES {
            let kv = create(ty).unwrap();
            let _ = kv.wait_all();
            kv.init("p", &rsp(&SHAPE, vec![0, 2], vec![1.0; 8], Context::cpu(0))).unwrap();
            kv.set_optimizer(Optimizer::sgd().with_learning_rate(0.1)).unwrap();
            kv.push("p", &rsp(&SHAPE, vec![0], vec![1.0; 4], Context::cpu(0))).expect("the push itself is accepted");
            let out = NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0));
            kv.row_sparse_pull("p", &out, &arange_i64(4)).unwrap();
            match out.wait_to_read() {
                Err(synkv::ndarray::Error::Engine(engine::Error::Failed { op: "push", source })) => {
                    let inner = source.downcast_ref::<Error>().unwrap_or_else(|| panic!("{ty}: a synkv::Error inside: {source:?}"));
                    assert!(
                        matches!(inner, Error::Store(StoreError::UnsupportedStorage { op: "push", stype: StorageType::RowSparse, key, .. }) if *key == Key::from("p")),
                        "{ty}: {inner:?}"
                    );
                    assert_msg(inner, &["key p", "every row"]);
                }
                other => panic!("{ty}: the pull should report the refused update, got {other:?}"),
            }
            assert!(kv.wait_all().is_err(), "{ty}: wait_all reports it too");
            kv.wait_all().unwrap();
            let again = NDArray::row_sparse_zeros(SHAPE, DType::F32, Context::cpu(0));
            kv.row_sparse_pull("p", &again, &arange_i64(4)).unwrap();
            assert_rows(&again, &[0, 1, 2, 3], |r| vec![if r % 2 == 0 { 1.0 } else { 0.0 }; 4], &format!("{ty}: the key kept its value"));
            // without the optimizer the key is pushed as usual
            kv.clear_updater();
            kv.push("p", &rsp(&SHAPE, vec![3], vec![4.0; 4], Context::cpu(0))).unwrap();
            kv.row_sparse_pull("p", &again, &ids_f32(&[1], &[3])).unwrap();
            assert_rows(&again, &[3], |_| vec![4.0; 4], &format!("{ty}: the store works"));
            kv.wait_all().unwrap();
        }
    });
}

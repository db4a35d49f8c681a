//! A property test: random sequences of store operations on a `local` store match a simple
//! sequential model (a map from key to values).
//!
//! Operations: init of new keys (random small shapes and values), pushes of 1–4 per-device
//! values, pulls into 1–3 outputs, pushpull (with outputs or in place), installing an updater
//! `stored += input · c` or removing it, all with random priorities; and invalid calls
//! (duplicate init, uninitialised key, wrong shape, wrong dtype, wrong key kind) that must fail
//! with the right error and change nothing. Pulled values are checked either at once (waiting
//! on the outputs) or at the end of the case, so operations also pile up asynchronously.

mod common;

use std::collections::HashMap;

use common::with_timeout;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use synkv::engine::Priority;
use synkv::store::{Error as StoreError, PullOptions};
use synkv::{create, Context, DType, Error, KVStore, Key, NDArray};

const SHAPES: [&[usize]; 5] = [&[1], &[3], &[2, 2], &[1, 5], &[2, 3]];
const MAX_SIZE: usize = 6;
const SCALES: [f64; 5] = [1.0, 2.0, 0.5, 3.0, -1.0];
const KEYS: i32 = 6;

#[derive(Clone, Debug)]
enum Op {
    Init { key: i32, shape: usize, vals: Vec<i8> },
    Push { key: i32, devs: Vec<Vec<i8>>, prio: Priority },
    Pull { key: i32, outs: usize, prio: Priority, wait_now: bool },
    PushPull { key: i32, devs: Vec<Vec<i8>>, in_place: bool, prio: Priority, wait_now: bool },
    SetUpdater { scale: usize },
    ClearUpdater,
    BadShape { key: i32 },
    BadDType { key: i32 },
    BadKind { key: i32 },
}

fn prio() -> impl Strategy<Value = Priority> {
    prop_oneof![Just(0), -10..10i32, Just(Priority::MAX), Just(Priority::MIN)]
}

fn vals() -> impl Strategy<Value = Vec<i8>> {
    prop::collection::vec(-8i8..=8, MAX_SIZE)
}

fn devs() -> impl Strategy<Value = Vec<Vec<i8>>> {
    prop::collection::vec(vals(), 1..=4)
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    prop_oneof![
        3 => (key.clone(), 0..SHAPES.len(), vals()).prop_map(|(key, shape, vals)| Op::Init { key, shape, vals }),
        5 => (key.clone(), devs(), prio()).prop_map(|(key, devs, prio)| Op::Push { key, devs, prio }),
        4 => (key.clone(), 1..=3usize, prio(), any::<bool>()).prop_map(|(key, outs, prio, wait_now)| Op::Pull { key, outs, prio, wait_now }),
        3 => (key.clone(), devs(), any::<bool>(), prio(), any::<bool>())
            .prop_map(|(key, devs, in_place, prio, wait_now)| Op::PushPull { key, devs, in_place, prio, wait_now }),
        1 => (0..SCALES.len()).prop_map(|scale| Op::SetUpdater { scale }),
        1 => Just(Op::ClearUpdater),
        1 => key.clone().prop_map(|key| Op::BadShape { key }),
        1 => key.clone().prop_map(|key| Op::BadDType { key }),
        1 => key.prop_map(|key| Op::BadKind { key }),
    ]
}

/// The sequential model: key → (shape index, values).
#[derive(Default)]
struct Model {
    entries: HashMap<i32, (usize, Vec<f64>)>,
    scale: Option<f64>,
}

impl Model {
    /// Applies a push of per-device values (already checked valid).
    fn push(&mut self, key: i32, devs: &[Vec<f64>]) {
        let scale = self.scale;
        let (_, stored) = self.entries.get_mut(&key).expect("valid push");
        let sum: Vec<f64> = (0..stored.len()).map(|i| devs.iter().map(|d| d[i]).sum()).collect();
        match scale {
            None => *stored = sum,
            Some(c) => stored.iter_mut().zip(&sum).for_each(|(s, x)| *s += x * c),
        }
    }
}

fn array(shape: &[usize], vals: &[f64], ctx: Context) -> NDArray {
    let data: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
    let a = NDArray::from_vec(shape.to_vec(), data).unwrap();
    if ctx == Context::cpu(0) {
        a
    } else {
        a.copy_to_context(ctx).unwrap()
    }
}

fn sized(v: &[i8], n: usize) -> Vec<f64> {
    v[..n].iter().map(|&x| f64::from(x)).collect()
}

fn expect_store_err(res: synkv::Result<()>, what: &str, ok: impl Fn(&StoreError) -> bool) -> Result<(), TestCaseError> {
    match res {
        Err(Error::Store(e)) if ok(&e) => Ok(()),
        other => Err(TestCaseError::fail(format!("{what}: unexpected result {other:?}"))),
    }
}

fn check(out: &NDArray, expected: &[f64], what: &str) -> Result<(), TestCaseError> {
    let got = out.to_vec::<f64>().map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
    prop_assert_eq!(got.len(), expected.len(), "{}", what);
    for (g, e) in got.iter().zip(expected) {
        prop_assert!((g - e).abs() <= 1e-6 * e.abs().max(1.0), "{}: got {:?}, expected {:?}", what, got, expected);
    }
    Ok(())
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let kv: KVStore = create("local").unwrap();
    let mut model = Model::default();
    let mut deferred: Vec<(NDArray, Vec<f64>, String)> = Vec::new();

    for (step, op) in ops.iter().enumerate() {
        let what = format!("step {step}: {op:?}");
        match op {
            Op::Init { key, shape, vals } => {
                let dims = SHAPES[*shape];
                let n = dims.iter().product();
                let v = sized(vals, n);
                let res = kv.init(*key, &array(dims, &v, Context::cpu(0)));
                if model.entries.contains_key(key) {
                    expect_store_err(res, &what, |e| matches!(e, StoreError::DuplicateInit { key: k } if *k == Key::Int(*key)))?;
                } else {
                    res.map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                    model.entries.insert(*key, (*shape, v));
                }
            }
            Op::Push { key, devs, prio } => match model.entries.get(key) {
                None => {
                    let res = kv.push_with_priority(*key, &array(&[1], &[1.0], Context::cpu(0)), *prio);
                    expect_store_err(res, &what, |e| matches!(e, StoreError::NotInitialized { .. }))?;
                }
                Some(&(shape, _)) => {
                    let dims = SHAPES[shape];
                    let n = dims.iter().product();
                    let dv: Vec<Vec<f64>> = devs.iter().map(|d| sized(d, n)).collect();
                    let arrays: Vec<NDArray> = dv.iter().enumerate().map(|(i, d)| array(dims, d, Context::cpu(i))).collect();
                    kv.push_with_priority(*key, &arrays, *prio).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                    model.push(*key, &dv);
                }
            },
            Op::Pull { key, outs, prio, wait_now } => match model.entries.get(key) {
                None => {
                    let res = kv.pull(*key, &NDArray::zeros([1]));
                    expect_store_err(res, &what, |e| matches!(e, StoreError::NotInitialized { .. }))?;
                }
                Some((shape, stored)) => {
                    let dims = SHAPES[*shape];
                    let o: Vec<NDArray> = (0..*outs).map(|i| NDArray::zeros_on(dims.to_vec(), Context::cpu(i))).collect();
                    kv.pull_with(*key, &o, PullOptions { priority: *prio, ignore_sparse: true })
                        .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                    for out in o {
                        if *wait_now {
                            check(&out, stored, &what)?;
                        } else {
                            deferred.push((out, stored.clone(), what.clone()));
                        }
                    }
                }
            },
            Op::PushPull { key, devs, in_place, prio, wait_now } => match model.entries.get(key).map(|e| e.0) {
                None => {
                    let a = NDArray::zeros([1]);
                    let res = kv.pushpull_with_priority(*key, &a, &a, *prio);
                    expect_store_err(res, &what, |e| matches!(e, StoreError::NotInitialized { .. }))?;
                }
                Some(shape) => {
                    let dims = SHAPES[shape];
                    let n = dims.iter().product();
                    let dv: Vec<Vec<f64>> = devs.iter().map(|d| sized(d, n)).collect();
                    let arrays: Vec<NDArray> = dv.iter().enumerate().map(|(i, d)| array(dims, d, Context::cpu(i))).collect();
                    let outs: Vec<NDArray> = if *in_place {
                        kv.pushpull_in_place_with_priority(*key, &arrays, *prio)
                            .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                        arrays
                    } else {
                        let o = vec![NDArray::zeros(dims.to_vec()), NDArray::zeros_on(dims.to_vec(), Context::cpu(1))];
                        kv.pushpull_with_priority(*key, &arrays, &o, *prio).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                        o
                    };
                    model.push(*key, &dv);
                    let stored = &model.entries[key].1;
                    for out in outs {
                        if *wait_now {
                            check(&out, stored, &what)?;
                        } else {
                            deferred.push((out, stored.clone(), what.clone()));
                        }
                    }
                }
            },
            Op::SetUpdater { scale } => {
                let c = SCALES[*scale];
                kv.set_updater(move |_k: &Key, input: &NDArray, stored: &mut NDArray| {
                    stored.axpy_assign(c, input)?;
                    Ok(())
                });
                model.scale = Some(c);
            }
            Op::ClearUpdater => {
                kv.clear_updater();
                model.scale = None;
            }
            Op::BadShape { key } => {
                let (dims, expect): (&[usize], fn(&StoreError) -> bool) = match model.entries.get(key) {
                    None => (&[7], |e| matches!(e, StoreError::NotInitialized { .. })),
                    Some(_) => (&[7], |e| matches!(e, StoreError::ShapeMismatch { .. })),
                };
                let bad = NDArray::ones(dims.to_vec());
                expect_store_err(kv.push(*key, &bad), &what, expect)?;
                expect_store_err(kv.pull(*key, &bad), &what, expect)?;
            }
            Op::BadDType { key } => match model.entries.get(key) {
                None => {}
                Some((shape, _)) => {
                    let bad = NDArray::ones_on(SHAPES[*shape].to_vec(), Context::cpu(0)).as_type(DType::F64).unwrap();
                    expect_store_err(kv.push(*key, &bad), &what, |e| matches!(e, StoreError::DTypeMismatch { .. }))?;
                }
            },
            Op::BadKind { key } => {
                let res = kv.push(format!("k{key}"), &NDArray::ones([1]));
                if model.entries.is_empty() {
                    expect_store_err(res, &what, |e| matches!(e, StoreError::NotInitialized { .. }))?;
                } else {
                    expect_store_err(res, &what, |e| matches!(e, StoreError::MixedKeyKinds { .. }))?;
                }
            }
        }
    }

    for (out, expected, what) in &deferred {
        check(out, expected, &format!("deferred check of {what}"))?;
    }
    // the final state of every key
    for (key, (shape, stored)) in &model.entries {
        let out = NDArray::zeros(SHAPES[*shape].to_vec());
        kv.pull(*key, &out).map_err(|e| TestCaseError::fail(format!("final pull of {key}: {e}")))?;
        check(&out, stored, &format!("final value of key {key}"))?;
    }
    kv.wait_all().map_err(|e| TestCaseError::fail(format!("wait_all: {e}")))?;
    Ok(())
}

#[test]
fn local_store_matches_a_sequential_model() {
    with_timeout(120, || {
        let config = Config { cases: 64, failure_persistence: None, ..Config::default() };
        let mut runner = TestRunner::new(config);
        let result = runner.run(&prop::collection::vec(op(), 1..=30), |ops| run(&ops));
        if let Err(e) = result {
            panic!("{e}");
        }
    });
}

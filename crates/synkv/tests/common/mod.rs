//! Helpers shared by the integration tests: a timeout guard and small array checks.
#![allow(dead_code)]

use std::sync::mpsc;
use std::time::Duration;

use synkv::{Context, NDArray};

// The list of the variables a job reads, shared with synkv-cli's and synkv-capi's tests.
#[path = "../../../synkv-cli/tests/util/clean_env.rs"]
mod clean_env;

/// Removes every variable a job reads (`DMLC_*`, `SYNKV_*`, `RANK`, ...; see
/// `synkv-cli/tests/util/clean_env.rs`) from this test process, for a test that needs to be
/// outside a job whatever the caller's shell holds (issue 14, item 7). The tests running
/// beside it in the binary use in-process stores, which these variables do not change (the
/// engine's thread count aside, read once, whose value no test depends on).
pub fn outside_a_job() {
    for (name, _) in std::env::vars_os() {
        if clean_env::is_job_variable(&name) {
            std::env::remove_var(name);
        }
    }
}

/// The default bound on one test body, in seconds.
pub const TIMEOUT_S: u64 = 30;

/// Runs `f` on its own thread and fails the test if it does not finish within `secs` seconds,
/// so a deadlock in the engine fails CI instead of hanging it. A panic in `f` is re-raised
/// here with its own message.
pub fn with_timeout<F: FnOnce() + Send + 'static>(secs: u64, f: F) {
    let (tx, rx) = mpsc::channel::<()>();
    let handle = std::thread::Builder::new()
        .name("test-body".into())
        .spawn(move || {
            f();
            let _ = tx.send(());
        })
        .expect("spawn the test body thread");
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => handle.join().expect("test body thread"),
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the body finished without reporting"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("test did not finish within {secs} s: a wait never returned (engine deadlock or lost completion?)")
        }
    }
}

/// [`with_timeout`] with [`TIMEOUT_S`].
pub fn bounded<F: FnOnce() + Send + 'static>(f: F) {
    with_timeout(TIMEOUT_S, f)
}

/// The in-process store types that every upstream case runs on.
pub const STORE_TYPES: [&str; 2] = ["local", "device"];

/// The elements of `a` as f64, waiting for pending writes; panics with `what` on an error.
pub fn values(a: &NDArray, what: &str) -> Vec<f64> {
    a.to_vec::<f64>().unwrap_or_else(|e| panic!("{what}: reading the array failed: {e}"))
}

/// Asserts that every element of `a` equals `expected` exactly.
#[track_caller]
pub fn assert_all(a: &NDArray, expected: f64, what: &str) {
    let v = values(a, what);
    assert!(!v.is_empty(), "{what}: empty array");
    assert!(v.iter().all(|&x| x == expected), "{what}: expected every element = {expected}, got {v:?}");
}

/// Asserts that `a` holds exactly `expected` (as f32 values).
#[track_caller]
pub fn assert_f32(a: &NDArray, expected: &[f32], what: &str) {
    let got = a.to_vec::<f32>().unwrap_or_else(|e| panic!("{what}: reading the array failed: {e}"));
    assert_eq!(got, expected, "{what}");
}

/// Asserts that `a` is within `tol` of `expected`, element by element.
#[track_caller]
pub fn assert_close(a: &NDArray, expected: &[f64], tol: f64, what: &str) {
    let got = values(a, what);
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= tol, "{what}: element {i}: got {g}, expected {e} (tolerance {tol}); all: {got:?}");
    }
}

/// `n` arrays of ones, one on each of `cpu(0)..cpu(n-1)`, each scaled by `scale`.
pub fn per_device(shape: &[usize], n: usize, scale: f64) -> Vec<NDArray> {
    (0..n).map(|i| NDArray::full_with(shape.to_vec(), scale, synkv::DType::F32, Context::cpu(i))).collect()
}

/// `n` zero arrays, one on each of `cpu(0)..cpu(n-1)`.
pub fn zeros_per_device(shape: &[usize], n: usize) -> Vec<NDArray> {
    (0..n).map(|i| NDArray::zeros_on(shape.to_vec(), Context::cpu(i))).collect()
}

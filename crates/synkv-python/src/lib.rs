//! # synkv-python — the `synkv` Python module
//!
//! Thin pyo3 bindings over [`synkv`]: each method converts its arguments, calls the core and
//! converts the result; KVStore semantics live in the core. Python code imports `synkv`
//! (`python/synkv/__init__.py`), which re-exports this private native module `synkv._native`
//! and adds the pure-Python parts: `RowSparseNDArray`, and the optimizer / scheduler
//! descriptions (`synkv.optimizer`, `synkv.lr_scheduler`) that `set_optimizer` sends to the
//! core as JSON.
//!
//! Layout:
//! - `store.rs` — `KVStore` (a `#[pyclass]` newtype over [`synkv::KVStore`]), `create`, and
//!   closing the stores still alive at exit;
//! - `request.rs` — `Request`, what a non-blocking (`block=False`) call returns;
//! - `args.rs` — keys and the one / list / list-of-lists shape of values and outputs;
//! - `arrays.rs` — borrowing NumPy / DLPack / buffer arrays without copying (`unsafe`);
//! - `updater.rs` — a Python callable as the store's updater, run on engine threads;
//! - `views.rs` — lending a store buffer to that updater as NumPy views (`unsafe`, with
//!   `arrays.rs`);
//! - `errors.rs` — the exception classes and the one mapping from synkv errors to them.
//!
//! Every wait releases the GIL. No engine operation touches a caller's array after the call
//! that borrowed it has returned.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]
// The exceptions, item by item: `arrays::Borrower::wrap`, which wraps a borrowed NumPy buffer,
// and `views::{borrow, refcount}`, which lend a store buffer to NumPy.
#![deny(unsafe_code)]

mod args;
mod arrays;
mod errors;
mod request;
mod store;
mod updater;
mod views;

use pyo3::prelude::*;

/// Refuses further store calls, closes the stores still alive and waits for every scheduled
/// operation; called from `atexit` so that no updater runs while the interpreter shuts down.
/// Returns the close failures that were never raised, which the hook turns into a non-zero
/// exit status.
#[pyfunction]
fn _drain(py: Python<'_>) -> Vec<String> {
    updater::close(py)
}

/// Sends the core's log (a dist worker's lost nodes, a straggler report from a server) to
/// stderr, at `SYNKV_LOG`'s level (default `warn`), unless the process has a logger already.
fn log_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SYNKV_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).try_init();
}

/// The native part of the `synkv` package.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    log_to_stderr();
    m.add_class::<store::PyKVStore>()?;
    m.add_class::<request::PyRequest>()?;
    m.add_function(wrap_pyfunction!(store::create, m)?)?;
    m.add_function(wrap_pyfunction!(_drain, m)?)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

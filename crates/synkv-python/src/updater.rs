//! A Python callable as the store's updater.
//!
//! The core calls the updater on an engine thread with `(key, merged input, stored value)`.
//! [`python_updater`] attaches to Python there (taking the GIL) and hands the callable the key
//! (an `int` or a `str`, as given by the user) and two NumPy arrays:
//!
//! - dense values (float32/64, float16, int32/64) arrive as **views, not copies**: `stored` is
//!   a writable view of the store's own buffer and `input` a read-only view of the summed
//!   input, lent by the core (`NDArray::with_dense_mut`) and moved into Python objects for the
//!   call (`views.rs`). `stored += input * 3` updates the store in place, with no copy back.
//!   They are valid during the call only: a view kept afterwards does not crash, it holds a
//!   detached copy-on-escape of the memory (the store then keeps a copy), so later writes
//!   through it do not reach the store;
//! - row-sparse values arrive as dense copies and are written back (a row-sparse key keeps the
//!   rows it had plus every non-zero row); bfloat16 values as float32 copies, rounded back.
//!
//! Either way the callable must change `stored` in place (`stored += ...`, `stored[:] = ...`).
//!
//! An exception raised by the callable fails that key's update: the next pull of the key (or
//! `wait_all`) raises `UpdaterError` with the exception as `__cause__`; the key keeps its last
//! good value. Store methods called from inside the updater raise instead of deadlocking.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use numpy::prelude::*;
use numpy::{Element, PyArray1};
use pyo3::prelude::*;
use pyo3::types::PyString;
use synkv::ndarray::{Buffer, BufferElement};
use synkv::{Context, DType, Key, NDArray, StorageType};

use crate::arrays::{Borrower, Mode};
use crate::errors::{ndarray_err, KVStoreError, PythonError};
use crate::views::{can_lend, Loan};

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as running a Python updater while it lives.
struct Inside;

impl Inside {
    fn enter() -> Inside {
        INSIDE.with(|f| f.set(true));
        Inside
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|f| f.set(false));
    }
}

/// Set once the interpreter exits (see [`close`]): store calls are refused from then on.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Refuses store calls made from inside an updater (they would wait on the very operation
/// that runs the updater) and calls made while the interpreter exits.
pub(crate) fn check_not_inside(op: &str) -> PyResult<()> {
    if INSIDE.with(Cell::get) {
        return Err(KVStoreError::new_err(format!(
            "{op} was called from inside an updater; an updater may only change its `stored` array"
        )));
    }
    if CLOSED.load(Ordering::Acquire) {
        return Err(KVStoreError::new_err(format!("{op} was called while the interpreter is exiting")));
    }
    Ok(())
}

/// Whether the interpreter is exiting (the exit hook has run).
pub(crate) fn is_closed() -> bool {
    CLOSED.load(Ordering::Acquire)
}

/// At interpreter exit: refuses new store calls (daemon threads may still be pushing), closes
/// the stores still alive (a dist worker leaves the cluster), then waits, without the GIL,
/// until every scheduled operation has finished, so that no updater needs Python once
/// finalisation starts. Returns the close failures that were never raised (the exit hook
/// makes them a non-zero exit status); errors of the operations themselves are dropped.
pub(crate) fn close(py: Python<'_>) -> Vec<String> {
    CLOSED.store(true, Ordering::Release);
    let failures = crate::store::close_all(py);
    let _ = py.detach(|| synkv::engine::Engine::global().wait_all());
    failures
}

/// The core updater that calls `callback(key, input, stored)`.
pub(crate) fn python_updater(callback: Py<PyAny>) -> impl Fn(&Key, &NDArray, &mut NDArray) -> synkv::Result<()> + Send + Sync + 'static {
    move |key, merged, stored| {
        Python::attach(|py| call(py, callback.bind(py), key, merged, stored).map_err(|e| synkv::Error::other(PythonError::new(py, e))))
    }
}

fn call(py: Python<'_>, callback: &Bound<'_, PyAny>, key: &Key, merged: &NDArray, stored: &mut NDArray) -> PyResult<()> {
    let key = match key {
        Key::Int(i) => i.into_pyobject(py)?.into_any(),
        Key::Str(s) => PyString::new(py, s).into_any(),
    };
    let dense = |a: &NDArray| a.storage_type() == StorageType::Dense && can_lend(a.dtype());
    if dense(merged) && dense(stored) && merged.dtype() == stored.dtype() {
        return call_with_views(py, callback, &key, merged, stored);
    }
    let input = to_numpy(py, merged)?;
    let value = to_numpy(py, stored)?;
    {
        let _inside = Inside::enter();
        callback.call1((key, &input, &value))?;
    }
    write_back(py, &value, stored)
}

/// Calls `callback(key, input, stored)` with NumPy views of the summed input (read-only) and
/// the stored value (writable), lent for the call without copying.
fn call_with_views(
    py: Python<'_>,
    callback: &Bound<'_, PyAny>,
    key: &Bound<'_, PyAny>,
    merged: &NDArray,
    stored: &NDArray,
) -> PyResult<()> {
    let dims = stored.shape().dims().to_vec();
    let lent = merged.with_dense_mut(|input_buf| {
        stored.with_dense_mut(|stored_buf| -> PyResult<()> {
            let input = Loan::start(py, input_buf)?;
            let value = match Loan::start(py, stored_buf) {
                Ok(loan) => loan,
                Err(e) => {
                    *input_buf = input.finish()?;
                    return Err(e);
                }
            };
            let outcome = (|| {
                let args = (key, input.view(&dims, false)?, value.view(&dims, true)?);
                let _inside = Inside::enter();
                callback.call1(args).map(drop)
            })();
            // The views are dropped: the buffers come back as they are, unless one escaped.
            *stored_buf = value.finish()?;
            *input_buf = input.finish()?;
            outcome
        })
    });
    lent.and_then(|r| r).map_err(ndarray_err)?
}

/// A dense NumPy copy of `nd` (float32 for bfloat16).
fn to_numpy<'py>(py: Python<'py>, nd: &NDArray) -> PyResult<Bound<'py, PyAny>> {
    fn typed<'py, T: Element + BufferElement>(py: Python<'py>, nd: &NDArray) -> PyResult<Bound<'py, PyAny>> {
        let v = nd.to_vec::<T>().map_err(ndarray_err)?;
        Ok(PyArray1::from_vec(py, v).reshape(nd.shape().dims().to_vec())?.into_any())
    }
    match nd.dtype() {
        DType::F64 => typed::<f64>(py, nd),
        DType::F16 => typed::<half::f16>(py, nd),
        DType::I32 => typed::<i32>(py, nd),
        DType::I64 => typed::<i64>(py, nd),
        _ => typed::<f32>(py, nd),
    }
}

/// Copies the updated NumPy array back into the stored value.
fn write_back(py: Python<'_>, value: &Bound<'_, PyAny>, stored: &mut NDArray) -> PyResult<()> {
    let mut borrower = Borrower::new(py);
    let i = borrower.array(value, Mode::Input)?;
    let updated = &borrower.arrays()[i];
    if stored.storage_type() == StorageType::RowSparse {
        *stored = to_row_sparse(updated, &stored.indices().map_err(ndarray_err)?)?;
        return Ok(());
    }
    // `stored` is the updater's own array (no pending operation), so this copy runs at once.
    updated.copy_to(stored).map_err(ndarray_err)
}

/// The row-sparse form of a dense result: the rows in `keep`, plus every non-zero row.
fn to_row_sparse(dense: &NDArray, keep: &[i64]) -> PyResult<NDArray> {
    let (rows, row_len) = (dense.shape().rows(), dense.shape().row_len());
    let values = dense.to_vec::<f64>().map_err(ndarray_err)?;
    let row = |r: usize| &values[r * row_len..(r + 1) * row_len];
    let ids: Vec<i64> =
        (0..rows).filter(|&r| keep.binary_search(&(r as i64)).is_ok() || row(r).iter().any(|&x| x != 0.0)).map(|r| r as i64).collect();
    let picked: Vec<f64> = ids.iter().flat_map(|&r| row(r as usize).iter().copied()).collect();
    let data = Buffer::from_vec(picked).cast(dense.dtype());
    NDArray::row_sparse(dense.shape().clone(), ids, data, Context::cpu(0)).map_err(ndarray_err)
}

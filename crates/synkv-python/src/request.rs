//! `synkv.Request`: a store call that returned before the engine finished with its arrays
//! (`push`, `pull`, `pushpull` with `block=False`).
//!
//! A request keeps, until it has completed, the call's arrays (whose owner guards keep the
//! caller's zero-copy memory alive) and the Python objects passed in, plus one pending engine
//! wait per array (`Engine::begin_wait_to_write`, queued when the call returned, so later calls
//! on the same arrays never delay it). `wait()` blocks without the GIL, then writes row_sparse
//! outputs back and raises the first error; `done()` polls and never blocks. Either may be
//! called any number of times, from any thread: the outcome is settled once and kept, so a
//! failure is raised by every later `wait()`.
//!
//! Until a request has completed, the caller must not write its values or read its outputs
//! (the rust-numpy borrow flags are released when the call returns). Dropping a request
//! unfinished is safe: the engine operations hold the arrays until they finish; only the
//! error is lost (`wait_all` still reports it).

use std::sync::{Mutex, MutexGuard, TryLockError};

use pyo3::prelude::*;
use synkv::engine::{Engine, PendingWait};
use synkv::NDArray;

use crate::arrays::write_back_sparse;
use crate::errors::to_pyerr;
use crate::updater::check_not_inside;

/// A non-blocking store call in flight; see `KVStore.push(..., block=False)`.
#[pyclass(module = "synkv", name = "Request", frozen)]
pub(crate) struct PyRequest {
    op: &'static str,
    state: Mutex<State>,
}

struct State {
    waits: Vec<PendingWait>,
    /// The first error the finished waits returned.
    error: Option<synkv::Error>,
    arrays: Vec<NDArray>,
    sparse_outs: Vec<(Py<PyAny>, NDArray)>,
    objects: Vec<Py<PyAny>>,
    /// Set once settled.
    outcome: Option<Result<(), PyErr>>,
}

impl PyRequest {
    /// Tracks `arrays`, which operations scheduled by `op` use; keeps `objects` alive meanwhile.
    pub(crate) fn new(op: &'static str, arrays: Vec<NDArray>, sparse_outs: Vec<(Py<PyAny>, NDArray)>, objects: Vec<Py<PyAny>>) -> Self {
        let waits = arrays.iter().map(|a| Engine::global().begin_wait_to_write(a.var())).collect();
        let state = State { waits, error: None, arrays, sparse_outs, objects, outcome: None };
        PyRequest { op, state: Mutex::new(state) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    /// Finishes every wait (blocking); keeps the first error.
    fn drain(&mut self) {
        for w in self.waits.drain(..) {
            if let Err(e) = w.wait() {
                self.error.get_or_insert_with(|| synkv::ndarray::Error::from(e).into());
            }
        }
    }

    /// After [`State::drain`]: writes row_sparse outputs back, lets the arrays and objects go,
    /// and returns the outcome (computed once).
    fn settle(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.outcome.is_none() {
            let mut outcome = match self.error.take() {
                Some(e) => Err(to_pyerr(e)),
                None => Ok(()),
            };
            if outcome.is_ok() {
                outcome = self.sparse_outs.iter().try_for_each(|(obj, nd)| write_back_sparse(obj.bind(py), nd));
            }
            self.arrays.clear();
            self.sparse_outs.clear();
            self.objects.clear();
            self.outcome = Some(outcome);
        }
        match &self.outcome {
            Some(Err(e)) => Err(e.clone_ref(py)),
            _ => Ok(()),
        }
    }
}

#[pymethods]
impl PyRequest {
    /// Waits (releasing the GIL) until the call has finished with its arrays: values consumed,
    /// outputs written. Raises the call's error (a `KVStoreError`), every time it is called.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        check_not_inside("Request.wait")?;
        py.detach(|| self.lock().drain());
        self.lock().settle(py)
    }

    /// Whether the call has finished (then `wait()` returns or raises at once). Never blocks.
    fn done(&self, py: Python<'_>) -> bool {
        let mut state = match self.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return false, // another thread is waiting on it
        };
        if state.outcome.is_some() {
            return true;
        }
        if !state.waits.iter().all(PendingWait::is_done) {
            return false;
        }
        state.drain();
        // The outcome is kept for `wait()`.
        let _ = state.settle(py);
        true
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("<synkv.Request {} done={}>", self.op, self.done(py))
    }
}

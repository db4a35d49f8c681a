//! `synkv.KVStore`: the Python face of [`synkv::KVStore`], and `synkv.create`.
//!
//! Each method converts its arguments (keys via `args`, arrays via `arrays`, borrowed without
//! copying), calls the core with the GIL released, and — still without the GIL — waits until
//! the engine is done with the borrowed arrays:
//!
//! - `init`, `push`: until the values have been read (the caller may then reuse them; with an
//!   updater or optimizer that is before the update has run: the core consumes the values
//!   into a merge buffer first);
//! - `pull`, `pushpull`, `broadcast`, `row_sparse_pull`: until the outputs are written.
//!
//! So no engine operation touches a caller's memory after a method returns, and other Python
//! threads run while one waits. With `block=False`, every one of them but `init` returns a
//! `synkv.Request` (`request.rs`) as soon as the work is scheduled instead; the request then
//! keeps the arrays alive and does that wait in `Request.wait()`. The semantics (flattening, summing, updater order, errors)
//! are the core's; see `spec/KVSTORE_SEMANTICS.md` K0–K6.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, Weak};

use pyo3::exceptions::{PyTypeError, PyUserWarning, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use synkv::engine::Priority;
use synkv::store::PullOptions;
use synkv::NDArray;

use crate::args::{self, is_row_ids, Layout};
use crate::arrays::{is_array_like, Borrower, Mode};
use crate::errors::to_pyerr;
use crate::request::PyRequest;
use crate::updater::{check_not_inside, python_updater};

/// A key-value store of n-d arrays (MXNet's `KVStore`); create one with `synkv.create`.
#[pyclass(module = "synkv", name = "KVStore", frozen)]
pub(crate) struct PyKVStore {
    /// `None` only while being dropped.
    inner: Option<Arc<synkv::KVStore>>,
}

/// Every store created from Python, so that the exit hook can close those still alive (a
/// dist worker must tell the cluster it is done, or the job waits for it).
static LIVE: Mutex<Vec<Weak<synkv::KVStore>>> = Mutex::new(Vec::new());

/// Failures of closing a dist store that nobody could be told of (a store dropped, or closed
/// by the exit hook): the exit hook turns them into a non-zero exit status.
static UNREPORTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn unreported(kv: &synkv::KVStore, e: &synkv::Error) {
    let text = format!("closing the {} store: {e}", kv.type_name());
    eprintln!("synkv: {text}");
    if let Ok(mut u) = UNREPORTED.lock() {
        u.push(text);
    }
}

/// Closes every store still alive, without the GIL. Returns every close failure not raised
/// to Python (these, and the ones of stores dropped earlier).
pub(crate) fn close_all(py: Python<'_>) -> Vec<String> {
    let live: Vec<Arc<synkv::KVStore>> = LIVE.lock().map(|mut l| l.drain(..).filter_map(|w| w.upgrade()).collect()).unwrap_or_default();
    for kv in live {
        if let Err(e) = py.detach(|| kv.close()) {
            unreported(&kv, &e);
        }
    }
    UNREPORTED.lock().map(|mut u| std::mem::take(&mut *u)).unwrap_or_default()
}

impl PyKVStore {
    fn kv(&self) -> &synkv::KVStore {
        self.inner.as_deref().expect("a KVStore is only emptied by Drop")
    }
}

impl Drop for PyKVStore {
    /// A dist store leaves the cluster when dropped, which waits for the other workers: do
    /// that without the GIL (at exit the stores are closed already, so it is quick).
    fn drop(&mut self) {
        if let Some(kv) = self.inner.take() {
            if kv.store_type().is_dist() && !crate::updater::is_closed() {
                Python::attach(|py| {
                    py.detach(move || {
                        // Close here rather than in the store's drop, which could only log.
                        if let Err(e) = kv.close() {
                            unreported(&kv, &e);
                        }
                    })
                });
            }
        }
    }
}

/// Creates a store: `local`, `device`, or one of MXNet's aliases (`local_update_cpu`,
/// `local_allreduce_cpu`, `local_allreduce_device`). Names are case-insensitive.
#[pyfunction]
#[pyo3(signature = (name = None))]
pub(crate) fn create(name: Option<&Bound<'_, PyAny>>) -> PyResult<PyKVStore> {
    let name = match name {
        None => "local".to_owned(),
        Some(n) => n.cast::<PyString>().map_err(|_| PyTypeError::new_err("name must be a string"))?.to_cow()?.into_owned(),
    };
    let kv = Arc::new(synkv::create(&name).map_err(to_pyerr)?);
    if let Ok(mut live) = LIVE.lock() {
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&kv));
    }
    Ok(PyKVStore { inner: Some(kv) })
}

/// Waits until the engine has finished every read and write of `arrays`; every array is
/// waited for even after an error, and the first error is returned.
fn wait_done(arrays: &[NDArray]) -> synkv::Result<()> {
    let mut first = Ok(());
    for a in arrays {
        if let Err(e) = a.wait_to_write() {
            if first.is_ok() {
                first = Err(e.into());
            }
        }
    }
    first
}

/// Runs `call` without the GIL, then waits for the call's arrays (also without the GIL) —
/// even if `call` panicked, so that no engine operation outlives the borrow of the arrays.
fn run<R: Send>(py: Python<'_>, arrays: &[NDArray], call: impl FnOnce() -> synkv::Result<R> + Send) -> PyResult<R> {
    py.detach(|| {
        let result = catch_unwind(AssertUnwindSafe(call));
        let waited = wait_done(arrays);
        match result {
            Ok(result) => result.and_then(|r| waited.map(|()| r)),
            Err(panic) => resume_unwind(panic),
        }
    })
    .map_err(to_pyerr)
}

/// Runs `call` without the GIL and returns once its operations are scheduled (a
/// [`PyRequest`] then waits for them). If it fails or panics, waits for `arrays` like [`run`]
/// before raising, so nothing is left in flight.
fn schedule<R: Send>(py: Python<'_>, arrays: &[NDArray], call: impl FnOnce() -> synkv::Result<R> + Send) -> PyResult<R> {
    py.detach(|| match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => {
            let _ = wait_done(arrays);
            Err(e)
        }
        Err(panic) => {
            let _ = wait_done(arrays);
            resume_unwind(panic)
        }
    })
    .map_err(to_pyerr)
}

/// The request tracking a non-blocking call's borrowed arrays; `objects` are kept alive too.
fn request(op: &'static str, b: Borrower<'_>, objects: &[&Bound<'_, PyAny>]) -> PyRequest {
    let (arrays, sparse_outs) = b.detach();
    PyRequest::new(op, arrays, sparse_outs, objects.iter().map(|o| (*o).clone().unbind()).collect())
}

fn outputs<'py>(b: &mut Borrower<'py>, obj: &Bound<'py, PyAny>) -> PyResult<Layout> {
    args::layout(obj, is_array_like, |o| b.array(o, Mode::Output))
}

fn values<'py>(b: &mut Borrower<'py>, obj: &Bound<'py, PyAny>) -> PyResult<Layout> {
    args::layout(obj, is_array_like, |o| b.array(o, Mode::Input))
}

fn required<'a, 'py>(arg: Option<&'a Bound<'py, PyAny>>, op: &str, name: &str) -> PyResult<&'a Bound<'py, PyAny>> {
    arg.ok_or_else(|| PyTypeError::new_err(format!("{op} needs `{name}`")))
}

#[pymethods]
impl PyKVStore {
    /// Initialises keys with values (copied: later changes to the values do not reach the
    /// store). Each key is initialised once.
    fn init(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        check_not_inside("init")?;
        let keys = args::keys(key)?;
        let mut b = Borrower::new(py);
        let vals = values(&mut b, value)?;
        let all = b.arrays();
        run(py, all, || self.kv().init(keys, vals.arrays(all)))
    }

    /// Pushes values: the values of one key (a list, or the key repeated) are summed, then the
    /// updater runs on the sum, or the sum is assigned. Returns once the values have been read
    /// (the caller may overwrite them), which with an updater or optimizer is before the update
    /// has run. With `block=False` returns a `synkv.Request` at once instead; do not write the
    /// values until it is done.
    #[pyo3(signature = (key, value, priority = 0, *, block = true))]
    fn push(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        priority: Priority,
        block: bool,
    ) -> PyResult<Option<PyRequest>> {
        check_not_inside("push")?;
        let keys = args::keys(key)?;
        let mut b = Borrower::new(py);
        let vals = values(&mut b, value)?;
        let all = b.arrays();
        let call = || self.kv().push_with_priority(keys, vals.arrays(all), priority);
        if block {
            run(py, all, call)?;
            return Ok(None);
        }
        schedule(py, all, call)?;
        Ok(Some(request("push", b, &[value])))
    }

    /// Pulls values into `out` (a list of outputs for one key: each gets the value), in place.
    /// With `ignore_sparse` (the default) row_sparse outputs are skipped with a warning. With
    /// `block=False` returns a `synkv.Request` at once; `out` is written when it is done.
    #[pyo3(signature = (key, out = None, priority = 0, ignore_sparse = true, *, block = true))]
    fn pull(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        priority: Priority,
        ignore_sparse: bool,
        block: bool,
    ) -> PyResult<Option<PyRequest>> {
        check_not_inside("pull")?;
        let keys = args::keys(key)?;
        let out = required(out, "pull", "out")?;
        let mut b = Borrower::new(py);
        let outs = outputs(&mut b, out)?;
        let all = b.arrays();
        let call = || self.kv().pull_with(keys, outs.arrays(all), PullOptions { priority, ignore_sparse });
        let (report, pending) = if block {
            let report = run(py, all, call)?;
            b.finish()?;
            (report, None)
        } else {
            let report = schedule(py, all, call)?;
            (report, Some(request("pull", b, &[out])))
        };
        if !report.is_complete() {
            let keys: Vec<String> = report.skipped_sparse.iter().map(|k| k.to_string()).collect();
            let msg = format!(
                "pull skipped row_sparse outputs of keys [{}] (ignore_sparse=True); use row_sparse_pull, or pull(..., ignore_sparse=False)",
                keys.join(", ")
            );
            PyErr::warn(py, &py.get_type::<PyUserWarning>(), &std::ffi::CString::new(msg)?, 1)?;
        }
        Ok(pending)
    }

    /// Push then pull as one call. With `out=None` the result is written back into `value`.
    /// With `block=False` returns a `synkv.Request` at once; touch neither `value` nor `out`
    /// until it is done.
    #[pyo3(signature = (key, value, out = None, priority = 0, *, block = true))]
    fn pushpull(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        priority: Priority,
        block: bool,
    ) -> PyResult<Option<PyRequest>> {
        check_not_inside("pushpull")?;
        let keys = args::keys(key)?;
        let mut b = Borrower::new(py);
        let (vals, outs) = match out {
            None => (outputs(&mut b, value)?, None),
            Some(out) => {
                let outs = outputs(&mut b, out)?;
                (values(&mut b, value)?, Some(outs))
            }
        };
        let all = b.arrays();
        let call = || match &outs {
            None => self.kv().pushpull_in_place_with_priority(keys, vals.arrays(all), priority),
            Some(outs) => self.kv().pushpull_with_priority(keys, vals.arrays(all), outs.arrays(all), priority),
        };
        if block {
            run(py, all, call)?;
            b.finish()?;
            return Ok(None);
        }
        schedule(py, all, call)?;
        let objects: Vec<&Bound<'_, PyAny>> = std::iter::once(value).chain(out).collect();
        Ok(Some(request("pushpull", b, &objects)))
    }

    /// `init(key, value)` then `pull(key, out)`: the value reaches every output. Each key can be
    /// broadcast (or initialised) once. With `block=False` returns a `synkv.Request` once the
    /// keys are initialised; `out` is written when it is done.
    #[pyo3(signature = (key, value, out, priority = 0, *, block = true))]
    fn broadcast(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        priority: Priority,
        block: bool,
    ) -> PyResult<Option<PyRequest>> {
        check_not_inside("broadcast")?;
        let keys = args::keys(key)?;
        let mut b = Borrower::new(py);
        let outs = outputs(&mut b, out)?;
        let vals = values(&mut b, value)?;
        let all = b.arrays();
        let call = || self.kv().broadcast_with_priority(keys, vals.arrays(all), outs.arrays(all), priority);
        if block {
            run(py, all, call)?;
            b.finish()?;
            return Ok(None);
        }
        schedule(py, all, call)?;
        Ok(Some(request("broadcast", b, &[value, out])))
    }

    /// Pulls only the rows `row_ids` of row_sparse keys into `synkv.RowSparseNDArray` outputs.
    /// Row ids may have any numeric dtype and shape, be unsorted and repeat. Give one row-id
    /// array per output, or one for all outputs of a single key. With `block=False` returns a
    /// `synkv.Request` at once; the outputs are filled by its `wait()`.
    #[pyo3(signature = (key, out = None, priority = 0, row_ids = None, *, block = true))]
    fn row_sparse_pull(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        priority: Priority,
        row_ids: Option<&Bound<'_, PyAny>>,
        block: bool,
    ) -> PyResult<Option<PyRequest>> {
        check_not_inside("row_sparse_pull")?;
        let keys = args::keys(key)?;
        let out = required(out, "row_sparse_pull", "out")?;
        let row_ids = required(row_ids, "row_sparse_pull", "row_ids")?;
        let mut b = Borrower::new(py);
        let outs = outputs(&mut b, out)?;
        let ids = args::layout(row_ids, is_row_ids, |o| b.row_ids(o))?;
        let all = b.arrays();
        let call = || self.kv().row_sparse_pull_with_priority(keys, outs.arrays(all), ids.arrays(all), priority);
        if block {
            run(py, all, call)?;
            b.finish()?;
            return Ok(None);
        }
        schedule(py, all, call)?;
        Ok(Some(request("row_sparse_pull", b, &[out, row_ids])))
    }

    /// Installs `updater(key, input, stored)`, called once per key per push on the summed
    /// input; it must change `stored` in place. `None` restores the default (assign).
    fn set_updater(&self, updater: Option<Py<PyAny>>, py: Python<'_>) -> PyResult<()> {
        if self.kv().store_type().is_dist() {
            let msg = c"set_updater has no effect on a dist store (updates run on the servers); use set_optimizer";
            PyErr::warn(py, &py.get_type::<PyUserWarning>(), msg, 1)?;
        }
        match updater {
            None => self.kv().clear_updater(),
            Some(f) if f.bind(py).is_callable() => self.kv().set_updater(python_updater(f)),
            Some(_) => return Err(PyTypeError::new_err("updater must be callable as updater(key, input, stored), or None")),
        }
        Ok(())
    }

    /// MXNet's name for [`set_updater`](Self::set_updater).
    fn _set_updater(&self, updater: Option<Py<PyAny>>, py: Python<'_>) -> PyResult<()> {
        self.set_updater(updater, py)
    }

    /// The store type as given to `create`, lower-cased.
    #[getter(r#type)]
    fn type_name(&self) -> &str {
        self.kv().type_name()
    }

    /// This worker's rank (0 for in-process stores).
    #[getter]
    fn rank(&self) -> usize {
        self.kv().rank()
    }

    /// The number of workers (1 for in-process stores).
    #[getter]
    fn num_workers(&self) -> usize {
        self.kv().num_workers()
    }

    /// Installs an optimizer (MXNet's `set_optimizer`): every push then runs it on the summed
    /// gradient of each key, in place of any updater; optimizer states start empty. Takes a
    /// `synkv.optimizer` object (anything with `to_json()`) or its JSON description.
    fn set_optimizer(&self, py: Python<'_>, optimizer: &Bound<'_, PyAny>) -> PyResult<()> {
        check_not_inside("set_optimizer")?;
        let json: String = match optimizer.cast::<PyString>() {
            Ok(s) => s.to_cow()?.into_owned(),
            Err(_) => optimizer.call_method0("to_json").and_then(|j| j.extract()).map_err(|_| {
                PyTypeError::new_err("set_optimizer takes a synkv.optimizer.Optimizer (e.g. synkv.optimizer.SGD(...)) or its JSON")
            })?,
        };
        let opt = synkv::optimizer::Optimizer::from_json(&json).map_err(|e| to_pyerr(e.into()))?;
        py.detach(|| self.kv().set_optimizer(opt)).map_err(to_pyerr)
    }

    /// Turns on gradient compression (MXNet's `set_gradient_compression`): a dict such as
    /// `{"type": "2bit", "threshold": 0.5}`; values are converted with `str()` as MXNet does.
    /// A `device` store then quantizes every push; `local` stores refuse, as in MXNet.
    fn set_gradient_compression(&self, py: Python<'_>, compression_params: &Bound<'_, PyDict>) -> PyResult<()> {
        check_not_inside("set_gradient_compression")?;
        let mut pairs: Vec<(String, String)> = Vec::with_capacity(compression_params.len());
        for (k, v) in compression_params.iter() {
            pairs.push((k.str()?.to_cow()?.into_owned(), v.str()?.to_cow()?.into_owned()));
        }
        py.detach(|| self.kv().set_gradient_compression(pairs)).map_err(to_pyerr)
    }

    /// Saves the optimizer's states to `fname` once every scheduled update has run. The file
    /// always records the optimizer's configuration too (`dump_optimizer` is accepted for
    /// MXNet compatibility). Raises if no optimizer is installed.
    #[pyo3(signature = (fname, dump_optimizer = false))]
    fn save_optimizer_states(&self, py: Python<'_>, fname: std::path::PathBuf, dump_optimizer: bool) -> PyResult<()> {
        let _ = dump_optimizer;
        check_not_inside("save_optimizer_states")?;
        py.detach(|| self.kv().save_optimizer_states(&fname)).map_err(to_pyerr)
    }

    /// Loads optimizer states saved by `save_optimizer_states` into the installed optimizer
    /// (which must be the same kind); a bad file raises and changes nothing.
    fn load_optimizer_states(&self, py: Python<'_>, fname: std::path::PathBuf) -> PyResult<()> {
        check_not_inside("load_optimizer_states")?;
        py.detach(|| self.kv().load_optimizer_states(&fname)).map_err(to_pyerr)
    }

    /// Whether the store supports a capability: `"optimizer"` (set_optimizer) is supported.
    fn is_capable(&self, capability: &str) -> PyResult<bool> {
        match capability.to_ascii_lowercase().as_str() {
            "optimizer" => Ok(true),
            other => Err(PyValueError::new_err(format!("Unknown capability: {other}"))),
        }
    }

    /// Takes a consistent checkpoint of a dist job's servers into the directory `dir`: every
    /// worker calls it at the same point of training (it meets the others at barriers, after
    /// its own operations are done). Returns `(id, round)`, the same on every worker. A job
    /// started with `SYNKV_CHECKPOINT_DIR=dir` resumes from the newest checkpoint
    /// (`resumed_round`). In-process stores raise `KVStoreUnsupportedError`.
    fn checkpoint(&self, py: Python<'_>, dir: std::path::PathBuf) -> PyResult<(u64, u64)> {
        check_not_inside("checkpoint")?;
        let info = py.detach(|| self.kv().checkpoint(&dir)).map_err(to_pyerr)?;
        Ok((info.id, info.round))
    }

    /// The round (rank 0's push calls) of the checkpoint this dist job resumed from, or `None`
    /// when it started fresh: a training loop goes on from there.
    #[getter]
    fn resumed_round(&self) -> Option<u64> {
        self.kv().resumed_round()
    }

    /// A barrier across workers (a no-op for in-process stores).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        check_not_inside("barrier")?;
        py.detach(|| self.kv().barrier()).map_err(to_pyerr)
    }

    /// MXNet's name for [`barrier`](Self::barrier).
    fn _barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.barrier(py)
    }

    /// Waits for every scheduled operation of the process; raises the first error an operation
    /// raised since the last `wait_all` (e.g. a failed update).
    fn wait_all(&self, py: Python<'_>) -> PyResult<()> {
        check_not_inside("wait_all")?;
        py.detach(|| self.kv().wait_all()).map_err(to_pyerr)
    }

    /// Waits for every scheduled operation; a dist worker then leaves the cluster (the job
    /// ends once every worker has). Called for every live store at interpreter exit.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        check_not_inside("close")?;
        py.detach(|| self.kv().close()).map_err(to_pyerr)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    fn __repr__(&self) -> String {
        format!("<synkv.KVStore type='{}'>", self.kv().type_name())
    }
}

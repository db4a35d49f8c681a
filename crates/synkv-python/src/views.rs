//! Lending a store buffer to Python as a NumPy view, without copying — with `arrays.rs`, the
//! crate's only `unsafe`.
//!
//! A [`Loan`] moves a [`Buffer`] (the store's stored value or a push's summed input, lent by
//! the core through `NDArray::with_dense_mut`) into a small Python object, [`Lent`], and hands
//! out NumPy arrays over its memory whose base is that object. So the memory belongs to
//! whatever Python still references it:
//!
//! - [`Loan::finish`] moves the buffer back out, unchanged and without copying, only when the
//!   loan holds the sole reference to the `Lent`, i.e. no NumPy array over it is alive
//!   (every such array, and every view or buffer export of one, keeps its base alive);
//! - otherwise a view escaped (kept in a global, raised in a traceback...): the store gets a
//!   copy, and the original memory stays with the `Lent` until the last view is gone. Writes
//!   through an escaped view then reach only that detached memory, never the store.
//!
//! No NumPy array can therefore point at memory the store still uses or has freed. Checking
//! the reference count and moving the buffer happen with the GIL held and no Python code in
//! between, so no thread can take a new reference meanwhile (abi3 builds run with the GIL).

use std::sync::Mutex;

use numpy::ndarray::ArrayViewMut1;
use numpy::{Element, PyArray1};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use synkv::ndarray::Buffer;
use synkv::DType;

/// Owns a lent buffer while NumPy arrays over its memory may be alive (their `base`).
#[pyclass(module = "synkv", name = "_LentBuffer", frozen)]
pub(crate) struct Lent {
    buf: Mutex<Option<Buffer>>,
}

/// A buffer lent to Python; see the module docs.
pub(crate) struct Loan<'py> {
    owner: Bound<'py, Lent>,
}

/// Whether a buffer of `dtype` can be lent (NumPy has no bfloat16).
pub(crate) fn can_lend(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::I32 | DType::I64)
}

impl<'py> Loan<'py> {
    /// Moves `*slot` into a new [`Lent`], leaving an empty buffer of its dtype in `slot`.
    pub(crate) fn start(py: Python<'py>, slot: &mut Buffer) -> PyResult<Loan<'py>> {
        let owner = Bound::new(py, Lent { buf: Mutex::new(None) })?;
        let buf = std::mem::replace(slot, Buffer::zeros(slot.dtype(), 0));
        *lock(&owner)? = Some(buf);
        Ok(Loan { owner })
    }

    /// A NumPy array of shape `dims` over the lent memory; read-only unless `writable`.
    pub(crate) fn view(&self, dims: &[usize], writable: bool) -> PyResult<Bound<'py, PyAny>> {
        let flat = {
            let mut guard = lock(&self.owner)?;
            let buf = guard.as_mut().ok_or_else(|| PyRuntimeError::new_err("synkv: a lent buffer was already returned"))?;
            let owner = self.owner.clone().into_any();
            match buf {
                Buffer::F32(d) => borrow(d, owner),
                Buffer::F64(d) => borrow(d, owner),
                Buffer::F16(d) => borrow(d, owner),
                Buffer::I32(d) => borrow(d, owner),
                Buffer::I64(d) => borrow(d, owner),
                other => return Err(PyRuntimeError::new_err(format!("synkv: {} buffers cannot be viewed from Python", other.dtype()))),
            }
        };
        if !writable {
            let kwargs = PyDict::new(self.owner.py());
            kwargs.set_item("write", false)?;
            flat.call_method("setflags", (), Some(&kwargs))?;
        }
        flat.call_method1("reshape", (dims.to_vec(),))
    }

    /// Ends the loan: the buffer itself when no view of it is alive, else a copy (the views
    /// keep the original). Drop every view the loan handed out before calling this.
    pub(crate) fn finish(self) -> PyResult<Buffer> {
        let escaped = refcount(&self.owner) > 1;
        let mut guard = lock(&self.owner)?;
        let buf = if escaped { guard.as_ref().cloned() } else { guard.take() };
        buf.ok_or_else(|| PyRuntimeError::new_err("synkv: a lent buffer was already returned"))
    }
}

/// `owner`'s reference count.
#[allow(unsafe_code)]
fn refcount(owner: &Bound<'_, Lent>) -> isize {
    // SAFETY: `owner` is a live object (we hold a reference) and the GIL is held.
    unsafe { pyo3::ffi::Py_REFCNT(owner.as_ptr()) }
}

fn lock<'a>(owner: &'a Bound<'_, Lent>) -> PyResult<std::sync::MutexGuard<'a, Option<Buffer>>> {
    owner.get().buf.lock().map_err(|_| PyRuntimeError::new_err("synkv: a lent buffer's lock is poisoned"))
}

/// A writable 1-d NumPy array over `data`, with `owner` (which owns `data`) as its base.
#[allow(unsafe_code)]
fn borrow<'py, T: Element>(data: &mut [T], owner: Bound<'py, PyAny>) -> Bound<'py, PyAny> {
    let view = ArrayViewMut1::from(data);
    // SAFETY: `data` is the memory of the buffer held by `owner` (a `Lent`), made the array's
    // base, so the array never outlives the object that owns the memory. The buffer is not
    // moved out of `owner`, reallocated or dropped while any array over it is alive:
    // `Loan::finish` takes it only when the loan's reference is the last one to `owner` (each
    // array, and each view or export of it, holds a reference to its base), and otherwise
    // copies it and leaves it in place; `Lent` never touches the buffer otherwise. The pointer
    // comes from a mutable borrow, and nothing in Rust reads or writes the memory while Python
    // may write through the array, except the copy in `finish`, made with the GIL held.
    unsafe { PyArray1::borrow_from_array(&view, owner) }.into_any()
}

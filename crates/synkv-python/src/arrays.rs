//! Borrowing Python arrays as synkv [`NDArray`]s without copying — the crate's only `unsafe`.
//!
//! A [`Borrower`] lives for one store call. It turns each Python value or output into an
//! `NDArray` whose elements *are* the caller's memory ([`Data::external`]), and keeps what
//! makes that sound:
//!
//! - a rust-numpy borrow (read-only for values, read-write for outputs) held until the call
//!   returns, so other Rust extensions see the array as borrowed and an output that overlaps
//!   another array of the call is refused;
//! - an owner guard holding a strong reference to the NumPy array inside each `NDArray`, so the
//!   memory outlives every engine operation that still holds the array (a reference dropped on
//!   an engine thread is released by pyo3 the next time a thread attaches to Python).
//!
//! The store call then waits, with the GIL released, until the engine has finished every
//! operation on these arrays before it returns, so nothing touches the memory afterwards.
//!
//! Accepted objects: NumPy arrays; torch CPU tensors, viewed through `tensor.detach().numpy()`
//! (bfloat16 ones as int16 bits); other objects with `__dlpack__`, viewed through
//! `numpy.from_dlpack`; objects with the buffer protocol, viewed through `memoryview`.
//! Dtypes: float32, float64, float16, int32, int64. A value that is not C-contiguous, aligned,
//! native-endian and writable is copied first (documented); an output must be all of these.
//! The same array given twice in one call becomes one `NDArray` (so `[a, a]` sums `a` twice).
//!
//! Row-sparse values are duck-typed: an object with `stype == "row_sparse"` and `data`,
//! `indices`, `shape` attributes (`synkv.RowSparseNDArray`). Their data is borrowed like a dense
//! value; as outputs they are copied in, and written back after the call (their row count can
//! change, so they cannot be filled in place).

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use numpy::prelude::*;
use numpy::{Element, PyArray1, PyArrayDyn, PyUntypedArray};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{IntoPyDict, PyList, PyTuple};
use synkv::ndarray::{Buffer, BufferElement, Data, RowSparse, Storage};
use synkv::{Context, DType, NDArray};

use crate::errors::{ndarray_err, KVStoreDTypeError};

/// Calls `$this.$method::<T>(args)` with `T` the Rust type of a dtype.
macro_rules! by_dtype {
    ($dtype:expr, $this:ident . $method:ident ( $($arg:expr),* )) => {
        match $dtype {
            DType::F32 => $this.$method::<f32>($($arg),*),
            DType::F64 => $this.$method::<f64>($($arg),*),
            DType::F16 => $this.$method::<half::f16>($($arg),*),
            DType::I32 => $this.$method::<i32>($($arg),*),
            DType::I64 => $this.$method::<i64>($($arg),*),
            other => Err(KVStoreDTypeError::new_err(format!("dtype {other} cannot be passed from Python"))),
        }
    };
}

/// How a call uses an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Read by the store (pushed, initialised, broadcast).
    Input,
    /// Written by the store (pulled into).
    Output,
}

/// Keeps a value alive until the end of the call; implemented by every borrow guard.
trait Hold {}
impl<T: ?Sized> Hold for T {}

/// Keeps the NumPy array alive as long as an `NDArray` over its memory exists.
struct Owner {
    _array: Py<PyAny>,
}

/// Which memory an `NDArray` of this call wraps: the same array given twice is wrapped once.
#[derive(PartialEq, Eq, Hash)]
struct Identity {
    ptr: usize,
    shape: Vec<usize>,
    dtype: DType,
}

/// The arrays of one store call; see the module docs.
pub(crate) struct Borrower<'py> {
    py: Python<'py>,
    arrays: Vec<NDArray>,
    seen: HashMap<Identity, (Mode, usize)>,
    guards: Vec<Box<dyn Hold + 'py>>,
    sparse_outs: Vec<(Bound<'py, PyAny>, usize)>,
}

impl<'py> Borrower<'py> {
    pub(crate) fn new(py: Python<'py>) -> Borrower<'py> {
        Borrower { py, arrays: Vec::new(), seen: HashMap::new(), guards: Vec::new(), sparse_outs: Vec::new() }
    }

    /// Every array of the call, indexed by what [`Borrower::array`] returned.
    pub(crate) fn arrays(&self) -> &[NDArray] {
        &self.arrays
    }

    fn add(&mut self, nd: NDArray) -> usize {
        self.arrays.push(nd);
        self.arrays.len() - 1
    }

    /// Borrows one Python value or output; returns its index in [`Borrower::arrays`]. Borrow a
    /// call's outputs before its values, so a value that is also an output is shared.
    pub(crate) fn array(&mut self, obj: &Bound<'py, PyAny>, mode: Mode) -> PyResult<usize> {
        if is_row_sparse(obj)? {
            return self.row_sparse(obj, mode);
        }
        if let Some((arr, bf16)) = torch_to_numpy(obj)? {
            let arr = self.usable(arr, mode)?;
            if bf16 {
                return self.dense_bf16(arr, mode);
            }
            return by_dtype!(dtype_of(&arr)?, self.dense(arr, mode));
        }
        let mut arr = to_numpy(obj)?;
        if mode == Mode::Output && !is_writable(&arr)? && !arr.is(obj) && obj.hasattr("numpy")? {
            // numpy < 2.1 marks arrays borrowed through (unversioned) DLPack read-only; an
            // object's own `.numpy()` is a writable view of the same memory.
            arr = obj.call_method0("numpy")?.cast_into::<PyUntypedArray>()?;
        }
        let arr = self.usable(arr, mode)?;
        by_dtype!(dtype_of(&arr)?, self.dense(arr, mode))
    }

    /// Reads row ids (any numeric array or a list of ints) into an owned int64 array.
    pub(crate) fn row_ids(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<usize> {
        let ids = int64_vec(obj)?;
        let n = ids.len();
        let nd = NDArray::from_vec([n], ids).map_err(ndarray_err)?;
        Ok(self.add(nd))
    }

    /// `arr` itself when its memory can be wrapped; else a copy (a value) or an error (an output).
    fn usable(&self, arr: Bound<'py, PyUntypedArray>, mode: Mode) -> PyResult<Bound<'py, PyUntypedArray>> {
        let native = arr.dtype().is_native_byteorder().unwrap_or(true);
        if arr.is_c_contiguous() && arr.is_aligned() && native && is_writable(&arr)? {
            return Ok(arr);
        }
        if mode == Mode::Output {
            return Err(PyValueError::new_err(
                "an output must be a writable, C-contiguous, aligned, native-endian array (pull into a fresh numpy array or \
                 torch tensor, or use numpy.ascontiguousarray / tensor.contiguous() and copy back; numpy < 2.1 makes arrays \
                 borrowed through DLPack read-only)",
            ));
        }
        // The documented copy: a fresh C-contiguous, aligned, native-endian, writable array.
        let dtype = arr.dtype().call_method1("newbyteorder", ("=",))?;
        let kwargs = [("dtype", dtype), ("order", "C".into_pyobject(self.py)?.into_any())].into_py_dict(self.py)?;
        Ok(numpy(self.py)?.getattr("array")?.call((arr,), Some(&kwargs))?.cast_into::<PyUntypedArray>()?)
    }

    /// The index of memory already wrapped in this call, if it was (an output that is also a
    /// value of the call is refused).
    fn seen_before(&self, id: &Identity, mode: Mode) -> PyResult<Option<usize>> {
        match self.seen.get(id) {
            Some((Mode::Input, _)) if mode == Mode::Output => {
                Err(PyValueError::new_err("an array is both a value and an output of this call; pass it only as the output"))
            }
            Some((_, i)) => Ok(Some(*i)),
            None => Ok(None),
        }
    }

    /// Wraps a usable dense array (once per call: the same memory gives the same index).
    fn dense<T: Element + BufferElement>(&mut self, arr: Bound<'py, PyUntypedArray>, mode: Mode) -> PyResult<usize> {
        let typed = arr.cast_into::<PyArrayDyn<T>>()?;
        let id = Identity { ptr: typed.data() as usize, shape: typed.shape().to_vec(), dtype: T::DTYPE };
        if let Some(i) = self.seen_before(&id, mode)? {
            return Ok(i);
        }
        let shape = id.shape.clone();
        let buf = self.wrap(typed, mode)?;
        let i = self.add(NDArray::from_buffer(shape, buf, Context::cpu(0)).map_err(ndarray_err)?);
        self.seen.insert(id, (mode, i));
        Ok(i)
    }

    /// Wraps a usable int16 array holding a torch bfloat16 tensor's bits as a bfloat16 value.
    fn dense_bf16(&mut self, arr: Bound<'py, PyUntypedArray>, mode: Mode) -> PyResult<usize> {
        let typed = arr.cast_into::<PyArrayDyn<i16>>()?;
        let id = Identity { ptr: typed.data() as usize, shape: typed.shape().to_vec(), dtype: DType::BF16 };
        if let Some(i) = self.seen_before(&id, mode)? {
            return Ok(i);
        }
        let shape = id.shape.clone();
        let (ptr, len, owner) = self.borrow(typed, mode)?;
        // SAFETY: the same as in `wrap` (a usable, borrowed, owned array of `len` i16); i16 and
        // bf16 have the same size and alignment, and every bit pattern is a valid bf16.
        #[allow(unsafe_code)]
        let data = unsafe { Data::external(ptr.cast::<half::bf16>(), len, owner) }
            .ok_or_else(|| PyValueError::new_err("array data is not aligned for its dtype"))?;
        let i = self.add(NDArray::from_buffer(shape, Buffer::from_data(data), Context::cpu(0)).map_err(ndarray_err)?);
        self.seen.insert(id, (mode, i));
        Ok(i)
    }

    /// Takes the borrow of a usable array for the call; returns its data pointer, its length
    /// and the owner guard that keeps it alive.
    fn borrow<T: Element + 'static>(
        &mut self,
        typed: Bound<'py, PyArrayDyn<T>>,
        mode: Mode,
    ) -> PyResult<(*mut T, usize, Arc<dyn Any + Send + Sync>)> {
        let len = typed.len();
        let ptr = typed.data();
        let guard: Box<dyn Hold + 'py> = match mode {
            Mode::Input => Box::new(typed.try_readonly().map_err(overlap)?),
            Mode::Output => Box::new(typed.try_readwrite().map_err(overlap)?),
        };
        self.guards.push(guard);
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(Owner { _array: typed.into_any().unbind() });
        Ok((ptr, len, owner))
    }

    /// Borrows a usable array and wraps its memory as a buffer, without copying.
    #[allow(unsafe_code)]
    fn wrap<T: Element + BufferElement>(&mut self, typed: Bound<'py, PyArrayDyn<T>>, mode: Mode) -> PyResult<Buffer> {
        let (ptr, len, owner) = self.borrow(typed, mode)?;
        // SAFETY: `ptr` is the data of a C-contiguous, aligned, writable NumPy array of `len`
        // elements of `T` (checked by `usable`, or a fresh copy with these properties); NumPy
        // keeps it valid and initialised while the array lives, and `owner` keeps the array
        // alive as long as the `Data`. Exclusive use while the engine may touch it: the
        // rust-numpy borrow just taken (read-write for outputs) is held until the call returns,
        // and the call returns only after every engine operation on this array has finished;
        // the caller's documented promise is that no other Python thread writes the array
        // meanwhile. The store only reads values, so concurrent readers of a value are harmless.
        let data =
            unsafe { Data::external(ptr, len, owner) }.ok_or_else(|| PyValueError::new_err("array data is not aligned for its dtype"))?;
        Ok(Buffer::from_data(data))
    }

    fn row_sparse(&mut self, obj: &Bound<'py, PyAny>, mode: Mode) -> PyResult<usize> {
        let shape: Vec<usize> = obj.getattr("shape")?.extract()?;
        let indices = int64_vec(&obj.getattr("indices")?)?;
        let data = self.usable(to_numpy(&obj.getattr("data")?)?, Mode::Input)?;
        let buf = by_dtype!(dtype_of(&data)?, self.wrap_untyped(data))?;
        // An output is filled by replacing its rows, so it gets an owned copy of its content.
        let buf = if mode == Mode::Output { buf.clone() } else { buf };
        let i = self.add(NDArray::row_sparse(shape, indices, buf, Context::cpu(0)).map_err(ndarray_err)?);
        if mode == Mode::Output {
            self.sparse_outs.push((obj.clone(), i));
        }
        Ok(i)
    }

    fn wrap_untyped<T: Element + BufferElement>(&mut self, arr: Bound<'py, PyUntypedArray>) -> PyResult<Buffer> {
        let typed = arr.cast_into::<PyArrayDyn<T>>()?;
        self.wrap(typed, Mode::Input)
    }

    /// After the call's operations have finished: writes row_sparse outputs back into their
    /// Python objects (`data`, `indices`).
    pub(crate) fn finish(self) -> PyResult<()> {
        for (obj, i) in &self.sparse_outs {
            write_back_sparse(obj, &self.arrays[*i])?;
        }
        Ok(())
    }

    /// Ends the call's borrows but keeps its arrays, for a call that returns before the engine
    /// is done with them: the arrays (whose owner guards keep the Python memory alive) and the
    /// row_sparse outputs to write back later with [`write_back_sparse`]. From here on the
    /// rust-numpy borrow flags no longer protect the arrays; the caller must not touch them
    /// until the engine has finished.
    pub(crate) fn detach(self) -> (Vec<NDArray>, Vec<(Py<PyAny>, NDArray)>) {
        let sparse = self.sparse_outs.iter().map(|(obj, i)| (obj.clone().unbind(), self.arrays[*i].clone())).collect();
        (self.arrays, sparse)
    }
}

/// Writes a row_sparse output (`nd`, whose operations have finished) back into its Python
/// object (`data`, `indices`).
pub(crate) fn write_back_sparse(obj: &Bound<'_, PyAny>, nd: &NDArray) -> PyResult<()> {
    if let Storage::RowSparse(RowSparse { indices, data }) = nd.storage_snapshot().map_err(ndarray_err)? {
        let mut dims = nd.shape().dims().to_vec();
        if let Some(first) = dims.first_mut() {
            *first = indices.len();
        }
        obj.setattr("data", buffer_to_numpy(obj.py(), &data, &dims)?)?;
        obj.setattr("indices", PyArray1::from_vec(obj.py(), indices))?;
    }
    Ok(())
}

fn overlap(err: numpy::BorrowError) -> PyErr {
    PyValueError::new_err(format!(
        "{err}: an output overlaps another array of this call, or the array is in use by a call on another thread; use separate arrays"
    ))
}

fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    NUMPY.get_or_try_init(py, || py.import("numpy").map(Bound::unbind)).map(|m| m.bind(py))
}

fn is_writable(arr: &Bound<'_, PyUntypedArray>) -> PyResult<bool> {
    arr.getattr("flags")?.getattr("writeable")?.extract()
}

/// Whether `obj` is a row_sparse value (`stype == "row_sparse"`, like MXNet's arrays).
pub(crate) fn is_row_sparse(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    if obj.is_instance_of::<PyUntypedArray>() {
        return Ok(false);
    }
    match obj.getattr_opt("stype")? {
        Some(s) => Ok(s.extract::<String>().is_ok_and(|s| s == "row_sparse")),
        None => Ok(false),
    }
}

/// Whether `obj` is an array (not a list of them): anything but a list or tuple.
pub(crate) fn is_array_like(obj: &Bound<'_, PyAny>) -> bool {
    !(obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>())
}

/// A NumPy view of a torch tensor's memory (`tensor.detach().numpy()`, writable on every
/// numpy version, unlike `numpy.from_dlpack` before numpy 2.1), and whether it holds bfloat16
/// bits (viewed as int16, since NumPy has no bfloat16); `None` for anything else. A tensor
/// that is not on the CPU raises torch's error (copy it with `.cpu()` first).
fn torch_to_numpy<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<(Bound<'py, PyUntypedArray>, bool)>> {
    let ty = obj.get_type();
    let module: String = ty.getattr("__module__")?.extract().unwrap_or_default();
    if !(module == "torch" || module.starts_with("torch.")) || !obj.hasattr("detach")? || !obj.hasattr("__dlpack__")? {
        return Ok(None);
    }
    let mut t = obj.call_method0("detach")?;
    let bf16 = t.getattr("dtype")?.str()?.to_cow()? == "torch.bfloat16";
    if bf16 {
        let int16 = obj.py().import("torch")?.getattr("int16")?;
        t = t.call_method1("view", (int16,))?;
    }
    Ok(Some((t.call_method0("numpy")?.cast_into::<PyUntypedArray>()?, bf16)))
}

/// A NumPy view of `obj`, without copying.
fn to_numpy<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        return Ok(arr.clone());
    }
    let py = obj.py();
    let np = numpy(py)?;
    if obj.hasattr("__dlpack__")? {
        return Ok(np.call_method1("from_dlpack", (obj,))?.cast_into::<PyUntypedArray>()?);
    }
    match py.import("builtins")?.getattr("memoryview")?.call1((obj,)) {
        Ok(view) => Ok(np.call_method1("asarray", (view,))?.cast_into::<PyUntypedArray>()?),
        Err(_) => Err(PyTypeError::new_err(format!(
            "expected an array (a numpy array, an object with __dlpack__ such as a torch CPU tensor, or a buffer) or a list of arrays, got {}",
            obj.get_type().name()?
        ))),
    }
}

/// The synkv dtype of a NumPy array.
fn dtype_of(arr: &Bound<'_, PyUntypedArray>) -> PyResult<DType> {
    let d = arr.dtype();
    Ok(match (d.kind(), d.itemsize()) {
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'f', 2) => DType::F16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        _ => {
            return Err(KVStoreDTypeError::new_err(format!(
                "unsupported dtype {}: synkv holds float32, float64 and float16 values (int32/int64 for row ids); bfloat16 is not supported from Python",
                d.str()?
            )))
        }
    })
}

/// The elements of `obj` (an array or a list of ints) as int64, flattened.
fn int64_vec(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    let np = numpy(obj.py())?;
    let flat = np.call_method1("asarray", (obj,))?.call_method1("astype", ("int64",))?.call_method0("ravel")?;
    let arr = flat.cast_into::<PyArray1<i64>>()?;
    Ok(arr.try_readonly()?.as_slice()?.to_vec())
}

/// A NumPy array (a copy) of `buf` with shape `dims`; bfloat16 becomes float32.
pub(crate) fn buffer_to_numpy<'py>(py: Python<'py>, buf: &Buffer, dims: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    let flat = match buf {
        Buffer::F32(d) => numpy::PyArray1::from_slice(py, d).into_any(),
        Buffer::F64(d) => numpy::PyArray1::from_slice(py, d).into_any(),
        Buffer::F16(d) => numpy::PyArray1::from_slice(py, d).into_any(),
        Buffer::I32(d) => numpy::PyArray1::from_slice(py, d).into_any(),
        Buffer::I64(d) => numpy::PyArray1::from_slice(py, d).into_any(),
        other => numpy::PyArray1::from_vec(py, other.to_vec::<f32>()).into_any(),
    };
    flat.call_method1("reshape", (dims.to_vec(),))
}

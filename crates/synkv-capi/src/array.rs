//! [`SynkvArray`]: the opaque array handle, and how its memory is owned.
//!
//! A handle wraps a [`synkv::NDArray`] plus what C needs to know about it (dims as `uint64_t`,
//! dtype, and for dense arrays the address of the elements). The elements live in one of:
//!
//! - **caller memory** ([`SynkvArray::view`]): zero-copy; the store reads and writes the C
//!   caller's buffer directly. Store calls wait for their operations on views before returning
//!   (see `store.rs`), so the caller may touch the buffer again once a call has returned;
//! - **memory this crate allocated** ([`SynkvArray::owned`]): the handle knows the address, so
//!   `synkv_array_data` can hand it out after waiting for pending operations;
//! - **row_sparse storage** inside synkv: no dense address; read with the row_sparse functions.
//!
//! Both dense cases go through [`Data::external`], whose contract (the memory stays valid and
//! nobody else touches it while the engine may) is upheld by the owner guard kept in the `Data`
//! (for owned memory) or by the caller of `synkv_array_view` (for views).

use std::any::Any;
use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use synkv::ndarray::{Buffer, BufferElement, Data, Storage};
use synkv::{Context, DType, NDArray, Shape, StorageType};

use crate::error::{CError, CResult};

/// `float32` (mshadow's code, as in MXNet's C API).
pub const SYNKV_DTYPE_F32: c_int = 0;
/// `float64`.
pub const SYNKV_DTYPE_F64: c_int = 1;
/// `float16` (IEEE half).
pub const SYNKV_DTYPE_F16: c_int = 2;
/// `int32`.
pub const SYNKV_DTYPE_I32: c_int = 4;
/// `int64`.
pub const SYNKV_DTYPE_I64: c_int = 6;
/// `bfloat16`.
pub const SYNKV_DTYPE_BF16: c_int = 12;

/// Dense storage: every element, row-major.
pub const SYNKV_STYPE_DENSE: c_int = 0;
/// Row-sparse storage: sorted unique row ids plus those rows.
pub const SYNKV_STYPE_ROW_SPARSE: c_int = 1;

/// An n-d array handle (opaque to C). Create with `synkv_array_create`, `synkv_array_view` or
/// `synkv_array_row_sparse`; free with `synkv_array_free`.
pub struct SynkvArray {
    /// Replaced only by the row_sparse setters; a lock so handles stay `Sync`.
    nd: Mutex<NDArray>,
    dims: Vec<u64>,
    dtype: DType,
    /// The dense elements' address, when this crate knows it.
    mem: Option<Mem>,
    /// Whether the elements are the caller's memory.
    view: bool,
}

/// An element address handed to C; this crate never dereferences it (synkv reaches the same
/// memory through its `Data`).
#[derive(Clone, Copy)]
struct Mem(NonNull<u8>);

// SAFETY: `Mem` is an address passed back to C, never dereferenced here; sending or sharing it
// between threads cannot cause a data race in this crate.
unsafe impl Send for Mem {}
// SAFETY: as above.
unsafe impl Sync for Mem {}

/// An allocation made by this crate for an owned array, freed when synkv drops the last
/// `Data` holding it.
struct Alloc<T> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: `Alloc` owns its elements like a `Box<[T]>`; it only frees them on drop.
unsafe impl<T: Send> Send for Alloc<T> {}
// SAFETY: `Alloc` exposes nothing; shared references cannot reach the elements.
unsafe impl<T: Sync> Sync for Alloc<T> {}

impl<T> Drop for Alloc<T> {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: `ptr`/`len` come from `Box::into_raw` in `SynkvArray::owned` and are freed once.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// Calls `$f::<T>($args)` with `T` the Rust element type of `$dtype`.
macro_rules! dispatch {
    ($dtype:expr, $f:ident($($arg:expr),*)) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::F16 => $f::<half::f16>($($arg),*),
            DType::BF16 => $f::<half::bf16>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            other => Err(CError::argument(format!("dtype {other} is not available through the C API"))),
        }
    };
}

impl std::fmt::Debug for SynkvArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SynkvArray").field("dims", &self.dims).field("dtype", &self.dtype).field("view", &self.view).finish_non_exhaustive()
    }
}

/// The dtype of a C dtype code.
pub(crate) fn dtype_from_code(code: c_int) -> CResult<DType> {
    Ok(match code {
        SYNKV_DTYPE_F32 => DType::F32,
        SYNKV_DTYPE_F64 => DType::F64,
        SYNKV_DTYPE_F16 => DType::F16,
        SYNKV_DTYPE_BF16 => DType::BF16,
        SYNKV_DTYPE_I32 => DType::I32,
        SYNKV_DTYPE_I64 => DType::I64,
        _ => return Err(CError::argument(format!("unknown dtype code {code}; use one of the SYNKV_DTYPE_* constants"))),
    })
}

/// The C code of a dtype.
pub(crate) fn dtype_code(dtype: DType) -> c_int {
    match dtype {
        DType::F32 => SYNKV_DTYPE_F32,
        DType::F64 => SYNKV_DTYPE_F64,
        DType::F16 => SYNKV_DTYPE_F16,
        DType::BF16 => SYNKV_DTYPE_BF16,
        DType::I32 => SYNKV_DTYPE_I32,
        DType::I64 => SYNKV_DTYPE_I64,
        _ => -1,
    }
}

/// The number of elements of `dims`, checked.
pub(crate) fn element_count(dims: &[u64]) -> CResult<usize> {
    let mut n: usize = 1;
    for &d in dims {
        let d = crate::ptr::len(d, "a dimension")?;
        n = n.checked_mul(d).ok_or_else(|| CError::argument(format!("shape {dims:?} has too many elements")))?;
    }
    Ok(n)
}

fn shape_of(dims: &[u64]) -> CResult<Shape> {
    dims.iter().map(|&d| crate::ptr::len(d, "a dimension")).collect::<CResult<Vec<usize>>>().map(Shape::from)
}

impl SynkvArray {
    fn new(nd: NDArray, mem: Option<Mem>, view: bool) -> SynkvArray {
        let dims = nd.shape().dims().iter().map(|&d| d as u64).collect();
        SynkvArray { dtype: nd.dtype(), dims, nd: Mutex::new(nd), mem, view }
    }

    /// A dense array owning `values` (moved into an allocation whose address C may receive).
    pub(crate) fn owned<T: BufferElement>(values: Vec<T>, dims: &[u64]) -> CResult<SynkvArray> {
        let len = values.len();
        let raw = Box::into_raw(values.into_boxed_slice());
        // `Box::into_raw` never returns NULL (an empty box gives a dangling, non-null pointer).
        let ptr = NonNull::new(raw.cast::<T>()).ok_or_else(|| CError::argument("allocation failed"))?;
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(Alloc { ptr, len });
        // SAFETY: the allocation holds `len` initialised `T`s and lives as long as `owner`, which
        // the `Data` keeps; only synkv (through this `Data`) and C callers of
        // `synkv_array_data` (after waiting for pending operations, per that function's
        // contract) touch it.
        let data = unsafe { Data::external(ptr.as_ptr(), len, owner) }.ok_or_else(|| CError::argument("misaligned allocation"))?;
        let nd = NDArray::from_buffer(shape_of(dims)?, Buffer::from_data(data), Context::cpu(0))?;
        Ok(SynkvArray::new(nd, Some(Mem(ptr.cast())), false))
    }

    /// A dense array of zeros.
    pub(crate) fn zeros(dtype: DType, dims: &[u64]) -> CResult<SynkvArray> {
        fn make<T: BufferElement>(dims: &[u64]) -> CResult<SynkvArray> {
            SynkvArray::owned(vec![T::default(); element_count(dims)?], dims)
        }
        dispatch!(dtype, make(dims))
    }

    /// A zero-copy view of `data` (row-major elements of `dtype`, shape `dims`).
    ///
    /// # Safety
    /// `data` points to `element_count(dims)` initialised elements of `dtype`, valid for reads
    /// and writes until the handle is freed, and not accessed by anyone else while a store call
    /// that uses the handle is running.
    pub(crate) unsafe fn view(data: *mut u8, dtype: DType, dims: &[u64]) -> CResult<SynkvArray> {
        fn make<T: BufferElement>(data: *mut u8, dims: &[u64]) -> CResult<SynkvArray> {
            let len = element_count(dims)?;
            // SAFETY: forwarded from `view`'s contract; the owner guard is empty because the
            // caller owns the memory.
            let d = unsafe { Data::external(data.cast::<T>(), len, Arc::new(())) }
                .ok_or_else(|| CError::argument(format!("view data pointer {data:p} is NULL or not aligned for {}", T::DTYPE)))?;
            let nd = NDArray::from_buffer(shape_of(dims)?, Buffer::from_data(d), Context::cpu(0))?;
            Ok(SynkvArray::new(nd, NonNull::new(data).map(Mem), true))
        }
        dispatch!(dtype, make(data, dims))
    }

    /// A row_sparse array holding `indices` (sorted, unique, in range) and their rows.
    pub(crate) fn row_sparse(dtype: DType, dims: &[u64], indices: Vec<i64>, data: &[u8]) -> CResult<SynkvArray> {
        let nd = row_sparse_array(dtype, dims, indices, data)?;
        Ok(SynkvArray::new(nd, None, false))
    }

    /// An independent copy of a store-owned array (for updater callbacks): dense arrays get
    /// memory whose address C may use, row_sparse ones keep their rows.
    pub(crate) fn copy_of(nd: &NDArray) -> CResult<SynkvArray> {
        let dims: Vec<u64> = nd.shape().dims().iter().map(|&d| d as u64).collect();
        match nd.storage_type() {
            StorageType::Dense => {
                fn make<T: BufferElement>(nd: &NDArray, dims: &[u64]) -> CResult<SynkvArray> {
                    SynkvArray::owned(nd.to_vec::<T>()?, dims)
                }
                dispatch!(nd.dtype(), make(nd, &dims))
            }
            _ => match nd.storage_snapshot()? {
                Storage::RowSparse(r) => {
                    let copy = NDArray::row_sparse(nd.shape().clone(), r.indices, r.data, Context::cpu(0))?;
                    Ok(SynkvArray::new(copy, None, false))
                }
                other => Err(CError::argument(format!("unexpected {} storage", other.storage_type()))),
            },
        }
    }

    /// The array (a cheap shared handle).
    pub(crate) fn array(&self) -> NDArray {
        self.nd.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Replaces the array after waiting for every pending operation on the old one.
    fn replace(&self, new: NDArray) -> CResult {
        let mut guard = self.nd.lock().unwrap_or_else(PoisonError::into_inner);
        guard.wait_to_write()?;
        *guard = new;
        Ok(())
    }

    pub(crate) fn dims(&self) -> &[u64] {
        &self.dims
    }

    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    pub(crate) fn is_view(&self) -> bool {
        self.view
    }

    fn nbytes(&self) -> CResult<usize> {
        Ok(element_count(&self.dims)? * self.dtype.size_of())
    }

    /// Waits for pending operations, then the dense elements' address.
    pub(crate) fn data_ptr(&self) -> CResult<*mut u8> {
        let mem = self.mem.ok_or_else(|| {
            CError::argument("a row_sparse array has no dense data pointer; use synkv_array_read or synkv_array_row_sparse_read")
        })?;
        self.array().wait_to_write()?;
        Ok(mem.0.as_ptr())
    }

    /// Copies the elements (densified, in the array's dtype) to `dst` (`nbytes` long).
    pub(crate) fn read(&self, dst: &mut [u8]) -> CResult {
        self.check_nbytes(dst.len())?;
        fn typed<T: BufferElement>(nd: &NDArray, dst: &mut [u8]) -> CResult {
            copy_to_bytes(&nd.to_vec::<T>()?, dst);
            Ok(())
        }
        dispatch!(self.dtype, typed(&self.array(), dst))
    }

    /// Writes `src` (the array's dtype, row-major) into the array: dense arrays in place,
    /// row_sparse arrays are replaced by one holding every row.
    pub(crate) fn write(&self, src: &[u8]) -> CResult {
        self.check_nbytes(src.len())?;
        let nd = self.array();
        let shape = nd.shape().clone();
        if nd.storage_type() == StorageType::Dense {
            fn typed<T: BufferElement>(nd: &NDArray, src: &[u8]) -> CResult {
                NDArray::from_vec(nd.shape().clone(), vec_from_bytes::<T>(src))?.copy_to(nd)?;
                Ok(())
            }
            return dispatch!(self.dtype, typed(&nd, src));
        }
        let all_rows: Vec<i64> = (0..shape.rows() as i64).collect();
        self.replace(row_sparse_array(self.dtype, &self.dims, all_rows, src)?)
    }

    /// Replaces a row_sparse array's rows.
    pub(crate) fn set_rows(&self, indices: Vec<i64>, data: &[u8]) -> CResult {
        if self.array().storage_type() != StorageType::RowSparse {
            return Err(CError::argument("synkv_array_row_sparse_set needs a row_sparse array; use synkv_array_write for dense ones"));
        }
        self.replace(row_sparse_array(self.dtype, &self.dims, indices, data)?)
    }

    /// A row_sparse array's stored row ids and rows (after pending writes complete).
    pub(crate) fn rows(&self) -> CResult<(Vec<i64>, Buffer)> {
        match self.array().storage_snapshot()? {
            Storage::RowSparse(r) => Ok((r.indices, r.data)),
            _ => Err(CError::argument("a dense array has no row ids; use synkv_array_read")),
        }
    }

    fn check_nbytes(&self, n: usize) -> CResult {
        let want = self.nbytes()?;
        if n != want {
            return Err(CError::argument(format!(
                "buffer of {n} bytes given for an array of {} elements of {} ({want} bytes)",
                element_count(&self.dims)?,
                self.dtype
            )));
        }
        Ok(())
    }
}

/// A row_sparse array from C data.
fn row_sparse_array(dtype: DType, dims: &[u64], indices: Vec<i64>, data: &[u8]) -> CResult<NDArray> {
    let shape = shape_of(dims)?;
    let want = indices.len() * shape.row_len() * dtype.size_of();
    if data.len() != want {
        return Err(CError::argument(format!(
            "{} bytes of row data given for {} rows of {shape} {dtype} ({want} bytes)",
            data.len(),
            indices.len()
        )));
    }
    fn buffer<T: BufferElement>(data: &[u8]) -> CResult<Buffer> {
        Ok(Buffer::from_vec(vec_from_bytes::<T>(data)))
    }
    let buf = dispatch!(dtype, buffer(data))?;
    Ok(NDArray::row_sparse(shape, indices, buf, Context::cpu(0))?)
}

/// Elements from raw bytes (any alignment); `src.len()` is a multiple of `size_of::<T>()`.
pub(crate) fn vec_from_bytes<T: BufferElement>(src: &[u8]) -> Vec<T> {
    let n = src.len() / std::mem::size_of::<T>();
    let mut v = vec![T::default(); n];
    // SAFETY: `v` holds `n * size_of::<T>()` writable bytes, `src` at least as many readable
    // ones; every bit pattern is a valid value of the element types (floats and ints).
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), v.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<T>()) };
    v
}

/// Copies elements into raw bytes; `dst.len()` equals the elements' size in bytes.
pub(crate) fn copy_to_bytes<T: BufferElement>(src: &[T], dst: &mut [u8]) {
    let n = std::mem::size_of_val(src).min(dst.len());
    // SAFETY: both ranges hold at least `n` bytes and do not overlap (`dst` is C memory or a
    // separate Rust buffer, `src` a fresh vector).
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().cast::<u8>(), dst.as_mut_ptr(), n) };
}

/// The bytes of a buffer in its own dtype.
pub(crate) fn buffer_bytes(buf: &Buffer, dst: &mut [u8]) -> CResult {
    fn typed<T: BufferElement>(buf: &Buffer, dst: &mut [u8]) -> CResult {
        copy_to_bytes(&buf.to_vec::<T>(), dst);
        Ok(())
    }
    dispatch!(buf.dtype(), typed(buf, dst))
}

/// The C code of a storage type.
pub(crate) fn stype_code(stype: StorageType) -> c_int {
    match stype {
        StorageType::Dense => SYNKV_STYPE_DENSE,
        _ => SYNKV_STYPE_ROW_SPARSE,
    }
}

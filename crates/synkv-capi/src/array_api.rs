//! The exported `synkv_array_*` functions: create, view, inspect, read, write, free.
//!
//! Shapes are `ndim` dimensions of `uint64_t`, outermost first (row-major, as in C and NumPy).
//! Dtypes are the `SYNKV_DTYPE_*` codes (MXNet's numbering). All arrays live on `cpu(0)`: a
//! multi-device push is simply several arrays for one key.

use std::ffi::{c_int, c_void};

use crate::array::{buffer_bytes, dtype_code, dtype_from_code, stype_code, SynkvArray};
use crate::error::{guard, CError};
use crate::ptr;

/// Creates a dense array of zeros that synkv owns.
///
/// # Safety
/// `shape` points to `ndim` values (may be NULL when `ndim` is 0); `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_array_create(dtype: c_int, ndim: u32, shape: *const u64, out: *mut *mut SynkvArray) -> c_int {
    guard(|| {
        // SAFETY: `shape` holds `ndim` values by contract.
        let dims = unsafe { ptr::slice(shape, ndim as usize, "shape") }?;
        let array = SynkvArray::zeros(dtype_from_code(dtype)?, dims)?;
        // SAFETY: `out` is writable by contract (NULL is rejected).
        unsafe { ptr::write_out(out, Box::into_raw(Box::new(array)), "out") }
    })
}

/// Creates a zero-copy view of caller memory: `data` holds the row-major elements of `dtype`
/// and shape `shape`. Store calls read (push, init) and write (pull) that memory directly and
/// wait for their work on it before they return, so once a call has returned the memory is the
/// caller's again. Free the view before freeing the memory.
///
/// # Safety
/// `data` is aligned for `dtype` and points to the product of `shape` initialised elements,
/// valid for reads and writes until `synkv_array_free(view)`; nothing else may access it while
/// a store call that uses the view runs; two views used by one call must not overlap.
#[no_mangle]
pub unsafe extern "C" fn synkv_array_view(
    data: *mut c_void,
    dtype: c_int,
    ndim: u32,
    shape: *const u64,
    out: *mut *mut SynkvArray,
) -> c_int {
    guard(|| {
        // SAFETY: `shape` holds `ndim` values by contract.
        let dims = unsafe { ptr::slice(shape, ndim as usize, "shape") }?;
        let dtype = dtype_from_code(dtype)?;
        if data.is_null() && crate::array::element_count(dims)? > 0 {
            return Err(CError::null("data"));
        }
        // SAFETY: forwarded from this function's contract.
        let array = unsafe { SynkvArray::view(data.cast(), dtype, dims) }?;
        // SAFETY: `out` is writable by contract.
        unsafe { ptr::write_out(out, Box::into_raw(Box::new(array)), "out") }
    })
}

/// Creates a row_sparse array of shape `shape` holding `nrows` rows: `indices` (sorted,
/// unique, each below `shape[0]`) and `data` (`nrows` rows of `shape[1..]` elements, `nbytes`
/// bytes). `nrows = 0` gives an all-zero array, the usual output of `row_sparse_pull`.
///
/// # Safety
/// `shape` holds `ndim` values; `indices` holds `nrows` values; `data` holds `nbytes` bytes
/// (either may be NULL when its length is 0); `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_array_row_sparse(
    dtype: c_int,
    ndim: u32,
    shape: *const u64,
    nrows: u64,
    indices: *const i64,
    data: *const c_void,
    nbytes: u64,
    out: *mut *mut SynkvArray,
) -> c_int {
    guard(|| {
        // SAFETY: lengths and pointers as in this function's contract.
        let (dims, ids, bytes) = unsafe {
            (
                ptr::slice(shape, ndim as usize, "shape")?,
                ptr::slice(indices, ptr::len(nrows, "nrows")?, "indices")?,
                ptr::slice(data.cast::<u8>(), ptr::len(nbytes, "nbytes")?, "data")?,
            )
        };
        let array = SynkvArray::row_sparse(dtype_from_code(dtype)?, dims, ids.to_vec(), bytes)?;
        // SAFETY: `out` is writable by contract.
        unsafe { ptr::write_out(out, Box::into_raw(Box::new(array)), "out") }
    })
}

/// Frees an array handle (NULL is a no-op). A view first waits for pending store operations
/// on it; their error, if any, is returned, and the handle is freed all the same.
///
/// # Safety
/// `array` is NULL or a handle from this library that is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn synkv_array_free(array: *mut SynkvArray) -> c_int {
    guard(|| {
        if array.is_null() {
            return Ok(());
        }
        // SAFETY: a live handle created by `Box::into_raw`, given up by the caller.
        let array = unsafe { Box::from_raw(array) };
        if array.is_view() {
            array.array().wait_to_write()?;
        }
        Ok(())
    })
}

/// The array's dimensions: `*ndim` receives their number, `*dims` a pointer to them that
/// stays valid as long as the handle.
///
/// # Safety
/// `array` is a live handle; `ndim` and `dims` are writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_array_shape(array: *const SynkvArray, ndim: *mut u32, dims: *mut *const u64) -> c_int {
    guard(|| {
        // SAFETY: a live handle by contract.
        let a = unsafe { ptr::as_ref(array, "array") }?;
        let n = u32::try_from(a.dims().len()).map_err(|_| CError::argument("too many dimensions"))?;
        // SAFETY: writable by contract.
        unsafe {
            ptr::write_out(ndim, n, "ndim")?;
            ptr::write_out(dims, a.dims().as_ptr(), "dims")
        }
    })
}

/// The array's dtype code (`SYNKV_DTYPE_*`).
///
/// # Safety
/// `array` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_array_dtype(array: *const SynkvArray, out: *mut c_int) -> c_int {
    guard(|| {
        // SAFETY: a live handle and a writable `out` by contract.
        unsafe { ptr::write_out(out, dtype_code(ptr::as_ref(array, "array")?.dtype()), "out") }
    })
}

/// The array's storage type (`SYNKV_STYPE_DENSE` or `SYNKV_STYPE_ROW_SPARSE`).
///
/// # Safety
/// `array` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_array_stype(array: *const SynkvArray, out: *mut c_int) -> c_int {
    guard(|| {
        // SAFETY: a live handle and a writable `out` by contract.
        unsafe { ptr::write_out(out, stype_code(ptr::as_ref(array, "array")?.array().storage_type()), "out") }
    })
}

/// The dense elements' address, after waiting for pending store operations on the array (their
/// error, if any, is returned instead). Valid until the handle is freed; do not access it while
/// a store call that uses the array runs. Not available for row_sparse arrays.
///
/// # Safety
/// `array` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_array_data(array: *mut SynkvArray, out: *mut *mut c_void) -> c_int {
    guard(|| {
        // SAFETY: a live handle by contract.
        let p = unsafe { ptr::as_ref(array, "array") }?.data_ptr()?;
        // SAFETY: writable by contract.
        unsafe { ptr::write_out(out, p.cast(), "out") }
    })
}

/// Copies the elements, densified, into `dst` (`nbytes` must be the element count times the
/// dtype size), after pending store operations on the array complete.
///
/// # Safety
/// `array` is a live handle; `dst` is writable for `nbytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn synkv_array_read(array: *const SynkvArray, dst: *mut c_void, nbytes: u64) -> c_int {
    guard(|| {
        // SAFETY: a live handle by contract.
        let a = unsafe { ptr::as_ref(array, "array") }?;
        let n = ptr::len(nbytes, "nbytes")?;
        if n > 0 && dst.is_null() {
            return Err(CError::null("dst"));
        }
        // SAFETY: `dst` is writable for `n` bytes by contract (NULL only with `n == 0`).
        let out = if n == 0 { &mut [][..] } else { unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), n) } };
        a.read(out)
    })
}

/// Copies `nbytes` bytes of elements (the array's dtype, row-major) from `src` into the array,
/// after pending store operations on it complete. A row_sparse array then holds every row.
///
/// # Safety
/// `array` is a live handle; `src` is readable for `nbytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn synkv_array_write(array: *mut SynkvArray, src: *const c_void, nbytes: u64) -> c_int {
    guard(|| {
        // SAFETY: a live handle and `nbytes` readable bytes by contract.
        let (a, bytes) = unsafe { (ptr::as_ref(array, "array")?, ptr::slice(src.cast::<u8>(), ptr::len(nbytes, "nbytes")?, "src")?) };
        a.write(bytes)
    })
}

/// The number of rows a row_sparse array holds (after pending store operations complete).
///
/// # Safety
/// `array` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_array_row_sparse_nrows(array: *const SynkvArray, out: *mut u64) -> c_int {
    guard(|| {
        // SAFETY: a live handle by contract.
        let (ids, _) = unsafe { ptr::as_ref(array, "array") }?.rows()?;
        // SAFETY: writable by contract.
        unsafe { ptr::write_out(out, ids.len() as u64, "out") }
    })
}

/// Copies a row_sparse array's row ids (`nrows` of them, as from
/// `synkv_array_row_sparse_nrows`) into `indices` and its rows (`nbytes` bytes) into `data`.
///
/// # Safety
/// `array` is a live handle; `indices` is writable for `nrows` values and `data` for `nbytes`
/// bytes (either may be NULL when its length is 0).
#[no_mangle]
pub unsafe extern "C" fn synkv_array_row_sparse_read(
    array: *const SynkvArray,
    indices: *mut i64,
    nrows: u64,
    data: *mut c_void,
    nbytes: u64,
) -> c_int {
    guard(|| {
        // SAFETY: a live handle by contract.
        let (ids, rows) = unsafe { ptr::as_ref(array, "array") }?.rows()?;
        let (n, nb) = (ptr::len(nrows, "nrows")?, ptr::len(nbytes, "nbytes")?);
        let want = rows.len() * rows.dtype().size_of();
        if n != ids.len() || nb != want {
            return Err(CError::argument(format!(
                "the array holds {} rows ({want} bytes of data); got room for {n} rows and {nb} bytes",
                ids.len()
            )));
        }
        if n > 0 {
            if indices.is_null() || data.is_null() {
                return Err(CError::null("indices or data"));
            }
            // SAFETY: writable for `n` ids and `nb` bytes by contract; non-NULL checked above.
            let (dst_ids, dst) =
                unsafe { (std::slice::from_raw_parts_mut(indices, n), std::slice::from_raw_parts_mut(data.cast::<u8>(), nb)) };
            dst_ids.copy_from_slice(&ids);
            buffer_bytes(&rows, dst)?;
        }
        Ok(())
    })
}

/// Replaces a row_sparse array's rows with `nrows` rows (`indices` sorted, unique, in range;
/// `data` `nbytes` bytes), after pending store operations on it complete. An updater callback
/// uses it to change a row_sparse `stored` value.
///
/// # Safety
/// `array` is a live handle; `indices` holds `nrows` values and `data` `nbytes` bytes (either
/// may be NULL when its length is 0).
#[no_mangle]
pub unsafe extern "C" fn synkv_array_row_sparse_set(
    array: *mut SynkvArray,
    nrows: u64,
    indices: *const i64,
    data: *const c_void,
    nbytes: u64,
) -> c_int {
    guard(|| {
        // SAFETY: lengths and pointers as in this function's contract.
        let (a, ids, bytes) = unsafe {
            (
                ptr::as_ref(array, "array")?,
                ptr::slice(indices, ptr::len(nrows, "nrows")?, "indices")?,
                ptr::slice(data.cast::<u8>(), ptr::len(nbytes, "nbytes")?, "data")?,
            )
        };
        a.set_rows(ids.to_vec(), bytes)
    })
}

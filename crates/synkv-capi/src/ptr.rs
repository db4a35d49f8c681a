//! Checked conversions from C arguments: NULL is rejected with [`SYNKV_ERR_NULL`] before any
//! dereference, lengths come with their pointers, strings must be UTF-8.
//!
//! Every function here is `unsafe` for one reason: a non-NULL pointer is trusted to point to
//! what the C signature promises (that is the caller's half of the contract, stated in the
//! `# Safety` section of each exported function). What can be checked, is.
//!
//! [`SYNKV_ERR_NULL`]: crate::SYNKV_ERR_NULL

use std::ffi::{c_char, CStr};

use crate::error::{CError, CResult};

/// A shared reference to `*p`, or an error naming `what` when `p` is NULL.
///
/// # Safety
/// `p` is NULL or points to a live, properly aligned `T` that is not mutated through other
/// pointers for `'a`.
pub(crate) unsafe fn as_ref<'a, T>(p: *const T, what: &str) -> CResult<&'a T> {
    // SAFETY: the caller guarantees `p` is NULL or valid for `'a`; NULL gives `None`.
    unsafe { p.as_ref() }.ok_or_else(|| CError::null(what))
}

/// Writes `value` to the out-parameter `out`.
///
/// # Safety
/// `out` is NULL or valid for a write of one `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T, what: &str) -> CResult {
    if out.is_null() {
        return Err(CError::null(what));
    }
    // SAFETY: non-NULL and writable by the caller's contract; `write` drops nothing.
    unsafe { out.write(value) };
    Ok(())
}

/// The slice of `len` elements at `p`. A zero length never dereferences `p` (which may then be
/// NULL).
///
/// # Safety
/// When `len > 0`, `p` is NULL or points to `len` initialised, aligned `T`s that stay unchanged
/// for `'a`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, len: usize, what: &str) -> CResult<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(CError::null(what));
    }
    // SAFETY: non-NULL, `len` valid elements by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The UTF-8 text of the NUL-terminated string at `p`.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays unchanged for `'a`.
pub(crate) unsafe fn str<'a>(p: *const c_char, what: &str) -> CResult<&'a str> {
    if p.is_null() {
        return Err(CError::null(what));
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|_| CError::argument(format!("{what} is not valid UTF-8")))
}

/// `usize` from a C length, for indexing.
pub(crate) fn len(n: u64, what: &str) -> CResult<usize> {
    usize::try_from(n).map_err(|_| CError::argument(format!("{what} ({n}) does not fit this platform's address space")))
}

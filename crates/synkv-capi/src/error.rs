//! Status codes, the thread-local last-error message, and [`guard`]: the one wrapper every
//! exported function body runs in (MXNet's `API_BEGIN` / `API_END`).
//!
//! A call returns [`SYNKV_OK`] (0) or a negative status naming the kind of failure; the message
//! is kept per thread and read with [`synkv_get_last_error`]. A panic never crosses the C
//! boundary: [`guard`] catches it and reports [`SYNKV_ERR_PANIC`]. A successful call leaves
//! the last message as it was (as MXNet does), so read it right after the failing call.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The call succeeded.
pub const SYNKV_OK: c_int = 0;
/// A required pointer argument was NULL.
pub const SYNKV_ERR_NULL: c_int = -1;
/// An argument was invalid: an unknown dtype code, a size that does not match the array, a
/// string that is not UTF-8, an array the call cannot use.
pub const SYNKV_ERR_ARGUMENT: c_int = -2;
/// The store rejected the call: unknown type, key not initialised, duplicate init, mixed key
/// kinds, shape or dtype mismatch for a key, unsupported storage or operation.
pub const SYNKV_ERR_STORE: c_int = -3;
/// An array operation failed (shape, dtype, storage or row ids).
pub const SYNKV_ERR_ARRAY: c_int = -4;
/// An asynchronous operation failed and this call waited for it: a failed updater (including
/// a callback that returned non-zero) is reported here, on the next wait for the key.
pub const SYNKV_ERR_ENGINE: c_int = -5;
/// synkv panicked (a bug); the message says where. The handles involved may be unusable.
pub const SYNKV_ERR_PANIC: c_int = -6;
/// Any other error.
pub const SYNKV_ERR_OTHER: c_int = -7;
/// An optimizer description or optimizer state file was rejected (unknown name or
/// parameter, value out of range, file of another optimizer or corrupted).
pub const SYNKV_ERR_OPTIMIZER: c_int = -8;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A failed call: its status code and message.
#[derive(Debug)]
pub(crate) struct CError {
    pub(crate) code: c_int,
    pub(crate) message: String,
}

impl CError {
    pub(crate) fn null(what: &str) -> CError {
        CError { code: SYNKV_ERR_NULL, message: format!("{what} is NULL") }
    }

    pub(crate) fn argument(message: impl Into<String>) -> CError {
        CError { code: SYNKV_ERR_ARGUMENT, message: message.into() }
    }
}

impl From<synkv::Error> for CError {
    fn from(e: synkv::Error) -> CError {
        let code = match &e {
            synkv::Error::Store(_) => SYNKV_ERR_STORE,
            synkv::Error::NDArray(synkv::ndarray::Error::Engine(_)) => SYNKV_ERR_ENGINE,
            synkv::Error::NDArray(_) => SYNKV_ERR_ARRAY,
            synkv::Error::Engine(_) => SYNKV_ERR_ENGINE,
            synkv::Error::Optimizer(_) => SYNKV_ERR_OPTIMIZER,
            _ => SYNKV_ERR_OTHER,
        };
        CError { code, message: e.to_string() }
    }
}

impl From<synkv::ndarray::Error> for CError {
    fn from(e: synkv::ndarray::Error) -> CError {
        CError::from(synkv::Error::from(e))
    }
}

/// The result of an exported function's body.
pub(crate) type CResult<T = ()> = Result<T, CError>;

/// Stores `message` as this thread's last error (interior NUL bytes become spaces).
pub(crate) fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Clears this thread's last error.
pub(crate) fn clear_last_error() {
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::default());
}

/// This thread's last error message (empty when none).
pub(crate) fn last_error() -> String {
    LAST_ERROR.with(|e| e.borrow().to_string_lossy().into_owned())
}

/// Runs an exported function's body: catches panics, turns `Err` into a status code and the
/// thread-local message. Every `extern "C"` function of this crate returns through here.
pub(crate) fn guard(body: impl FnOnce() -> CResult) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SYNKV_OK,
        Ok(Err(e)) => {
            set_last_error(&e.message);
            e.code
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            set_last_error(&format!("synkv panicked (a bug, please report it): {what}"));
            SYNKV_ERR_PANIC
        }
    }
}

/// The message of the last failed call on this thread, or `""`. The pointer stays valid until
/// the next failing call (or [`synkv_set_last_error`]) on the same thread. Never NULL.
///
/// This function and [`synkv_version`](crate::synkv_version) cannot panic, so they need no
/// guard: they only read a thread-local (falling back to `""` while the thread exits).
#[no_mangle]
pub extern "C" fn synkv_get_last_error() -> *const c_char {
    LAST_ERROR.try_with(|e| e.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}

/// Sets this thread's last-error message (MXNet's `MXAPISetLastError`). An updater callback
/// calls it before returning non-zero so that its message reaches the caller; NULL clears it.
///
/// # Safety
/// `message` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn synkv_set_last_error(message: *const c_char) -> c_int {
    guard(|| {
        if message.is_null() {
            clear_last_error();
            return Ok(());
        }
        // SAFETY: non-null and NUL-terminated by the caller's contract.
        let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
        set_last_error(&text);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_maps_errors_and_panics() {
        assert_eq!(guard(|| Ok(())), SYNKV_OK);
        assert_eq!(guard(|| Err(CError::argument("bad dtype"))), SYNKV_ERR_ARGUMENT);
        assert_eq!(last_error(), "bad dtype");
        assert_eq!(guard(|| panic!("boom")), SYNKV_ERR_PANIC);
        assert!(last_error().contains("boom"));
    }
}

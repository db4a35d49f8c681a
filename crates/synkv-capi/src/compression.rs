//! `synkv_kv_set_gradient_compression`: MXNet's `MXKVStoreSetGradientCompression`.

use std::ffi::{c_char, c_int};

use crate::error::guard;
use crate::ptr;
use crate::store::{store, SynkvKV};

/// Turns on gradient compression with MXNet's string parameters, e.g. `{"type", "threshold"}`
/// = `{"2bit", "0.5"}`. A `device` store then quantizes every pushed dense float32 value with a
/// residual per (key, source) and sums the dequantized values; a `local` store refuses (as
/// MXNet's Python and Perl front-ends do); the distributed stores refuse until compressed
/// pushes reach the servers.
///
/// # Safety
/// `kv` is a live store handle; `keys` and `vals` each hold `nparams` NUL-terminated strings
/// (both may be NULL when `nparams` is 0).
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_set_gradient_compression(
    kv: *mut SynkvKV,
    nparams: u32,
    keys: *const *const c_char,
    vals: *const *const c_char,
) -> c_int {
    guard(|| {
        // SAFETY: live handle and arrays of `nparams` strings, as in this function's contract.
        let (h, keys, vals) =
            unsafe { (store(kv)?, ptr::slice(keys, nparams as usize, "keys")?, ptr::slice(vals, nparams as usize, "vals")?) };
        let mut params = Vec::with_capacity(keys.len());
        for (i, (&k, &v)) in keys.iter().zip(vals).enumerate() {
            // SAFETY: each entry is a NUL-terminated string by contract.
            params.push(unsafe { (ptr::str(k, &format!("keys[{i}]"))?, ptr::str(v, &format!("vals[{i}]"))?) });
        }
        h.kv.set_gradient_compression(params)?;
        Ok(())
    })
}

//! Key and value arguments of the store functions, read from C.
//!
//! Every store function has an `_int` and a `_str` variant: `num` keys as `const int32_t*` or
//! `const char* const*`. Values come as one flat array of handles plus an optional per-key
//! count array: key `i` owns the next `counts[i]` handles (several devices' values, or several
//! outputs). `counts == NULL` means one handle per key. This is synkv's list-of-lists argument
//! ([`Arrays::Lists`](synkv::store::Arrays)), so the flattening rules are the core's.

use std::ffi::c_char;

use synkv::{Key, NDArray};

use crate::array::SynkvArray;
use crate::error::{CError, CResult};
use crate::ptr;

/// The keys argument of a call.
#[derive(Clone, Copy)]
pub(crate) enum KeyArg {
    /// `const int32_t* keys`.
    Int(*const i32),
    /// `const char* const* keys`.
    Str(*const *const c_char),
}

/// Reads `num` keys.
///
/// # Safety
/// The key pointer holds `num` entries (ints, or NUL-terminated strings), unchanged during the
/// call; it may be NULL when `num` is 0.
pub(crate) unsafe fn read_keys(num: u32, keys: KeyArg) -> CResult<Vec<Key>> {
    let n = num as usize;
    match keys {
        // SAFETY: `num` ints by contract.
        KeyArg::Int(p) => Ok(unsafe { ptr::slice(p, n, "keys") }?.iter().map(|&k| Key::Int(k)).collect()),
        KeyArg::Str(p) => {
            // SAFETY: `num` string pointers by contract.
            let ptrs = unsafe { ptr::slice(p, n, "keys") }?;
            ptrs.iter()
                .enumerate()
                // SAFETY: each entry is NULL or a NUL-terminated string by contract.
                .map(|(i, &s)| unsafe { ptr::str(s, &format!("keys[{i}]")) }.map(Key::from))
                .collect()
        }
    }
}

/// Handles grouped per key: the arrays (for synkv) and the handles (for waiting on views).
pub(crate) struct Grouped<'a> {
    pub(crate) lists: Vec<Vec<NDArray>>,
    pub(crate) handles: Vec<&'a SynkvArray>,
}

/// Reads the handles of `num` keys: `counts[i]` each (1 each when `counts` is NULL).
///
/// # Safety
/// `counts` is NULL or holds `num` values; `vals` holds their sum of live handles (may be NULL
/// when the sum is 0); the handles stay alive for `'a`.
pub(crate) unsafe fn read_grouped<'a>(num: u32, counts: *const u32, vals: *const *mut SynkvArray, what: &str) -> CResult<Grouped<'a>> {
    let n = num as usize;
    let counts: Vec<usize> = if counts.is_null() {
        vec![1; n]
    } else {
        // SAFETY: `num` counts by contract.
        unsafe { ptr::slice(counts, n, "counts") }?.iter().map(|&c| c as usize).collect()
    };
    let total = counts.iter().try_fold(0usize, |acc, &c| acc.checked_add(c)).ok_or_else(|| CError::argument("counts overflow"))?;
    // SAFETY: `total` handle pointers by contract.
    let ptrs = unsafe { ptr::slice(vals, total, what) }?;
    let mut handles = Vec::with_capacity(total);
    for (i, &p) in ptrs.iter().enumerate() {
        // SAFETY: each entry is NULL or a live handle by contract.
        handles.push(unsafe { ptr::as_ref(p.cast_const(), &format!("{what}[{i}]")) }?);
    }
    let mut lists = Vec::with_capacity(n);
    let mut next = 0;
    for c in counts {
        lists.push(handles[next..next + c].iter().map(|h| h.array()).collect());
        next += c;
    }
    Ok(Grouped { lists, handles })
}

//! The exported keyed store functions, written out one by one (cbindgen reads items, not
//! macros): an `_int` variant (`const int32_t* keys`) and a `_str` variant
//! (`const char* const* keys`) of each. The bodies live in `ops.rs`; argument conventions are
//! in `args.rs`.
//!
//! Shared safety contract of every function here: `kv` is a live store handle; `keys` holds
//! `num` keys (int32 values, or NUL-terminated UTF-8 strings); a count array is NULL or holds
//! `num` counts; each handle array holds as many live handles as its counts add up to (one per
//! key without counts), and no handle is freed during the call. A pointer may be NULL only
//! where its length is 0 or its documentation says so.

use std::ffi::{c_char, c_int};

use crate::args::KeyArg;
use crate::array::SynkvArray;
use crate::error::guard;
use crate::ops::{broadcast, init, pull_default, pull_sparse, push, pushpull, row_sparse_pull};
use crate::store::SynkvKV;

/// Initialises each key with one value (copied; `vals` holds one handle per key). Each key is
/// initialised once (MXNet's `MXKVStoreInit` / `MXKVStoreInitEx`).
///
/// # Safety
/// `kv` is live; `keys` holds `num` keys; each count array is NULL or holds `num` counts; each
/// handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_init_int(kv: *mut SynkvKV, num: u32, keys: *const i32, vals: *const *mut SynkvArray) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { init(kv, num, KeyArg::Int(keys), vals) })
}

/// Initialises each key with one value (copied; `vals` holds one handle per key). Each key is
/// initialised once (MXNet's `MXKVStoreInit` / `MXKVStoreInitEx`).
///
/// # Safety
/// `kv` is live; `keys` holds `num` NUL-terminated UTF-8 strings; each count array is NULL or
/// holds `num` counts; each handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_init_str(kv: *mut SynkvKV, num: u32, keys: *const *const c_char, vals: *const *mut SynkvArray) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { init(kv, num, KeyArg::Str(keys), vals) })
}

/// Pushes values: key `i` gets the next `counts[i]` handles of `vals` (`counts` NULL: one
/// each), which are summed; then the updater runs on the sum, or the sum is assigned. Among
/// ready operations a higher `priority` runs first (MXNet's `MXKVStorePush` / `PushEx`).
///
/// # Safety
/// `kv` is live; `keys` holds `num` keys; each count array is NULL or holds `num` counts; each
/// handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_push_int(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const i32,
    counts: *const u32,
    vals: *const *mut SynkvArray,
    priority: c_int,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { push(kv, num, KeyArg::Int(keys), counts, vals, priority) })
}

/// Pushes values: key `i` gets the next `counts[i]` handles of `vals` (`counts` NULL: one
/// each), which are summed; then the updater runs on the sum, or the sum is assigned. Among
/// ready operations a higher `priority` runs first (MXNet's `MXKVStorePush` / `PushEx`).
///
/// # Safety
/// `kv` is live; `keys` holds `num` NUL-terminated UTF-8 strings; each count array is NULL or
/// holds `num` counts; each handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_push_str(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const *const c_char,
    counts: *const u32,
    vals: *const *mut SynkvArray,
    priority: c_int,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { push(kv, num, KeyArg::Str(keys), counts, vals, priority) })
}

/// Pulls each key's value into its `counts[i]` outputs (`counts` NULL: one each); row_sparse
/// outputs are skipped (MXNet's `MXKVStorePull` / `PullEx`).
///
/// # Safety
/// `kv` is live; `keys` holds `num` keys; each count array is NULL or holds `num` counts; each
/// handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_pull_int(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const i32,
    counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { pull_default(kv, num, KeyArg::Int(keys), counts, outs, priority) })
}

/// Pulls each key's value into its `counts[i]` outputs (`counts` NULL: one each); row_sparse
/// outputs are skipped (MXNet's `MXKVStorePull` / `PullEx`).
///
/// # Safety
/// `kv` is live; `keys` holds `num` NUL-terminated UTF-8 strings; each count array is NULL or
/// holds `num` counts; each handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_pull_str(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const *const c_char,
    counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { pull_default(kv, num, KeyArg::Str(keys), counts, outs, priority) })
}

/// As `synkv_kv_pull_*`, choosing whether row_sparse outputs are skipped (`ignore_sparse`
/// non-zero, MXNet's default) or receive every row; `skipped` (may be NULL) receives the number
/// of keys whose outputs were skipped (MXNet's `MXKVStorePullWithSparse` / `…Ex`).
///
/// # Safety
/// `kv` is live; `keys` holds `num` keys; each count array is NULL or holds `num` counts; each
/// handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_pull_with_sparse_int(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const i32,
    counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
    ignore_sparse: c_int,
    skipped: *mut u32,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { pull_sparse(kv, num, KeyArg::Int(keys), counts, outs, priority, ignore_sparse, skipped) })
}

/// As `synkv_kv_pull_*`, choosing whether row_sparse outputs are skipped (`ignore_sparse`
/// non-zero, MXNet's default) or receive every row; `skipped` (may be NULL) receives the number
/// of keys whose outputs were skipped (MXNet's `MXKVStorePullWithSparse` / `…Ex`).
///
/// # Safety
/// `kv` is live; `keys` holds `num` NUL-terminated UTF-8 strings; each count array is NULL or
/// holds `num` counts; each handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_pull_with_sparse_str(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const *const c_char,
    counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
    ignore_sparse: c_int,
    skipped: *mut u32,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { pull_sparse(kv, num, KeyArg::Str(keys), counts, outs, priority, ignore_sparse, skipped) })
}

/// Push then pull as one call: key `i` pushes `val_counts[i]` values and its updated value
/// goes to `out_counts[i]` outputs; with `outs` NULL it goes back into the pushed values
/// (`out_counts` is then ignored). MXNet's `MXKVStorePushPull` / `…Ex`.
///
/// # Safety
/// `kv` is live; `keys` holds `num` keys; each count array is NULL or holds `num` counts; each
/// handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_pushpull_int(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const i32,
    val_counts: *const u32,
    vals: *const *mut SynkvArray,
    out_counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { pushpull(kv, num, KeyArg::Int(keys), val_counts, vals, out_counts, outs, priority) })
}

/// Push then pull as one call: key `i` pushes `val_counts[i]` values and its updated value
/// goes to `out_counts[i]` outputs; with `outs` NULL it goes back into the pushed values
/// (`out_counts` is then ignored). MXNet's `MXKVStorePushPull` / `…Ex`.
///
/// # Safety
/// `kv` is live; `keys` holds `num` NUL-terminated UTF-8 strings; each count array is NULL or
/// holds `num` counts; each handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_pushpull_str(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const *const c_char,
    val_counts: *const u32,
    vals: *const *mut SynkvArray,
    out_counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { pushpull(kv, num, KeyArg::Str(keys), val_counts, vals, out_counts, outs, priority) })
}

/// Initialises each key with its one value (`vals`: one handle per key), then pulls it into
/// its `out_counts[i]` outputs (MXNet's `MXKVStoreBroadcast` / `…Ex`).
///
/// # Safety
/// `kv` is live; `keys` holds `num` keys; each count array is NULL or holds `num` counts; each
/// handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_broadcast_int(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const i32,
    vals: *const *mut SynkvArray,
    out_counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { broadcast(kv, num, KeyArg::Int(keys), vals, out_counts, outs, priority) })
}

/// Initialises each key with its one value (`vals`: one handle per key), then pulls it into
/// its `out_counts[i]` outputs (MXNet's `MXKVStoreBroadcast` / `…Ex`).
///
/// # Safety
/// `kv` is live; `keys` holds `num` NUL-terminated UTF-8 strings; each count array is NULL or
/// holds `num` counts; each handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_broadcast_str(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const *const c_char,
    vals: *const *mut SynkvArray,
    out_counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { broadcast(kv, num, KeyArg::Str(keys), vals, out_counts, outs, priority) })
}

/// Pulls only some rows of row_sparse keys into row_sparse outputs: key `i` has `counts[i]`
/// outputs (`counts` NULL: one each) and output `j` gets the rows `row_ids[j]` (an array of
/// any numeric dtype and shape; ids may be unsorted and repeat). MXNet's
/// `MXKVStorePullRowSparse` / `…Ex`.
///
/// # Safety
/// `kv` is live; `keys` holds `num` keys; each count array is NULL or holds `num` counts; each
/// handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_row_sparse_pull_int(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const i32,
    counts: *const u32,
    outs: *const *mut SynkvArray,
    row_ids: *const *mut SynkvArray,
    priority: c_int,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { row_sparse_pull(kv, num, KeyArg::Int(keys), counts, outs, row_ids, priority) })
}

/// Pulls only some rows of row_sparse keys into row_sparse outputs: key `i` has `counts[i]`
/// outputs (`counts` NULL: one each) and output `j` gets the rows `row_ids[j]` (an array of
/// any numeric dtype and shape; ids may be unsorted and repeat). MXNet's
/// `MXKVStorePullRowSparse` / `…Ex`.
///
/// # Safety
/// `kv` is live; `keys` holds `num` NUL-terminated UTF-8 strings; each count array is NULL or
/// holds `num` counts; each handle array holds as many live handles as its counts add up to.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_row_sparse_pull_str(
    kv: *mut SynkvKV,
    num: u32,
    keys: *const *const c_char,
    counts: *const u32,
    outs: *const *mut SynkvArray,
    row_ids: *const *mut SynkvArray,
    priority: c_int,
) -> c_int {
    // SAFETY: this function's contract is the implementation's.
    guard(|| unsafe { row_sparse_pull(kv, num, KeyArg::Str(keys), counts, outs, row_ids, priority) })
}

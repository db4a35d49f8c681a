//! The keyed store functions: init, push, pull, pushpull, broadcast, row_sparse_pull, each in an
//! `_int` and a `_str` variant (MXNet's `MXKVStore*` and `MXKVStore*Ex`).
//!
//! Each call validates everything first (an error changes nothing), schedules its work and
//! returns without waiting, like synkv and MXNet, **except** that it waits for its operations
//! on views (`synkv_array_view`) — so caller memory is free again when the call returns — and,
//! with a caller-thread updater, `push`/`pushpull` wait for their updates. Arrays owned by synkv
//! are waited for when read (`synkv_array_read`, `synkv_array_data`) or by `synkv_kv_wait_all`.
//! An error of the work waited for is the call's status.

use std::ffi::c_int;

use synkv::store::{Arrays, Keys, PullOptions};
use synkv::NDArray;

use crate::args::{read_grouped, read_keys, Grouped, KeyArg};
use crate::array::SynkvArray;
use crate::error::CResult;
use crate::store::{store, wait_arrays, SynkvKV};

/// Waits for the views among `handles`.
fn settle<'a>(handles: impl IntoIterator<Item = &'a SynkvArray>) -> CResult {
    let arrays: Vec<NDArray> = handles.into_iter().filter(|h| h.is_view()).map(SynkvArray::array).collect();
    wait_arrays(&arrays)
}

/// Runs `schedule`, then waits as the module doc says; `pushes` marks calls that may run the
/// updater (served on this thread in caller-thread mode).
fn run(h: &SynkvKV, handles: Vec<&SynkvArray>, pushes: bool, schedule: impl FnOnce() -> synkv::Result<()>) -> CResult {
    schedule()?;
    if pushes && h.caller_thread_updater() {
        h.pump.serve_until_done(&h.kv, handles.into_iter().map(SynkvArray::array).collect())
    } else {
        settle(handles)
    }
}

/// # Safety
/// The exported function's contract (`ops_api.rs`).
pub(crate) unsafe fn init(kv: *const SynkvKV, num: u32, keys: KeyArg, vals: *const *mut SynkvArray) -> CResult {
    // SAFETY (all three): forwarded from the exported function's contract.
    let (h, keys, vals) = unsafe { (store(kv)?, read_keys(num, keys)?, read_grouped(num, std::ptr::null(), vals, "vals")?) };
    // init copies its values synchronously: nothing is left to wait for.
    Ok(h.kv.init(Keys::Many(keys), Arrays::Lists(&vals.lists))?)
}

/// # Safety
/// The exported function's contract (`ops_api.rs`).
pub(crate) unsafe fn push(
    kv: *const SynkvKV,
    num: u32,
    keys: KeyArg,
    counts: *const u32,
    vals: *const *mut SynkvArray,
    priority: c_int,
) -> CResult {
    // SAFETY (all three): forwarded from the exported function's contract.
    let (h, keys, vals) = unsafe { (store(kv)?, read_keys(num, keys)?, read_grouped(num, counts, vals, "vals")?) };
    let Grouped { lists, handles } = vals;
    run(h, handles, true, || h.kv.push_with_priority(Keys::Many(keys), Arrays::Lists(&lists), priority))
}

#[allow(clippy::too_many_arguments)]
/// # Safety
/// The exported function's contract (`ops_api.rs`).
pub(crate) unsafe fn pull(
    kv: *const SynkvKV,
    num: u32,
    keys: KeyArg,
    counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
    ignore_sparse: bool,
    skipped: *mut u32,
) -> CResult {
    // SAFETY (all three): forwarded from the exported function's contract.
    let (h, keys, outs) = unsafe { (store(kv)?, read_keys(num, keys)?, read_grouped(num, counts, outs, "outs")?) };
    let Grouped { lists, handles } = outs;
    let mut report = None;
    run(h, handles, false, || {
        report = Some(h.kv.pull_with(Keys::Many(keys), Arrays::Lists(&lists), PullOptions { priority, ignore_sparse })?);
        Ok(())
    })?;
    if !skipped.is_null() {
        let n = report.map_or(0, |r| r.skipped_sparse.len());
        // SAFETY: non-NULL `skipped` is writable by contract.
        unsafe { skipped.write(u32::try_from(n).unwrap_or(u32::MAX)) };
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
/// # Safety
/// The exported function's contract (`ops_api.rs`).
pub(crate) unsafe fn pushpull(
    kv: *const SynkvKV,
    num: u32,
    keys: KeyArg,
    val_counts: *const u32,
    vals: *const *mut SynkvArray,
    out_counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
) -> CResult {
    // SAFETY (all three): forwarded from the exported function's contract.
    let (h, keys, vals) = unsafe { (store(kv)?, read_keys(num, keys)?, read_grouped(num, val_counts, vals, "vals")?) };
    if outs.is_null() {
        let Grouped { lists, handles } = vals;
        return run(h, handles, true, || h.kv.pushpull_in_place_with_priority(Keys::Many(keys), Arrays::Lists(&lists), priority));
    }
    // SAFETY: forwarded from the exported function's contract.
    let outs = unsafe { read_grouped(num, out_counts, outs, "outs") }?;
    let handles: Vec<&SynkvArray> = vals.handles.iter().chain(&outs.handles).copied().collect();
    run(h, handles, true, || {
        h.kv.pushpull_with_priority(Keys::Many(keys), Arrays::Lists(&vals.lists), Arrays::Lists(&outs.lists), priority)
    })
}

#[allow(clippy::too_many_arguments)]
/// # Safety
/// The exported function's contract (`ops_api.rs`).
pub(crate) unsafe fn broadcast(
    kv: *const SynkvKV,
    num: u32,
    keys: KeyArg,
    vals: *const *mut SynkvArray,
    out_counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
) -> CResult {
    // SAFETY (all four): forwarded from the exported function's contract.
    let (h, keys, vals, outs) = unsafe {
        (
            store(kv)?,
            read_keys(num, keys)?,
            read_grouped(num, std::ptr::null(), vals, "vals")?,
            read_grouped(num, out_counts, outs, "outs")?,
        )
    };
    let Grouped { lists, handles } = outs;
    run(h, handles, false, || h.kv.broadcast_with_priority(Keys::Many(keys), Arrays::Lists(&vals.lists), Arrays::Lists(&lists), priority))
}

#[allow(clippy::too_many_arguments)]
/// # Safety
/// The exported function's contract (`ops_api.rs`).
pub(crate) unsafe fn row_sparse_pull(
    kv: *const SynkvKV,
    num: u32,
    keys: KeyArg,
    counts: *const u32,
    outs: *const *mut SynkvArray,
    row_ids: *const *mut SynkvArray,
    priority: c_int,
) -> CResult {
    // SAFETY (all four): forwarded from the exported function's contract.
    let (h, keys, outs, ids) = unsafe {
        (store(kv)?, read_keys(num, keys)?, read_grouped(num, counts, outs, "outs")?, read_grouped(num, counts, row_ids, "row_ids")?)
    };
    let Grouped { lists, handles } = outs;
    // Row ids are read synchronously by the call; only the outputs are written later.
    run(h, handles, false, || {
        h.kv.row_sparse_pull_with_priority(Keys::Many(keys), Arrays::Lists(&lists), Arrays::Lists(&ids.lists), priority)
    })
}

/// # Safety
/// The exported function's contract (`ops_api.rs`).
pub(crate) unsafe fn pull_default(
    kv: *const SynkvKV,
    num: u32,
    keys: KeyArg,
    counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
) -> CResult {
    // SAFETY: forwarded from the exported function's contract.
    unsafe { pull(kv, num, keys, counts, outs, priority, true, std::ptr::null_mut()) }
}

#[allow(clippy::too_many_arguments)]
/// # Safety
/// The exported function's contract (`ops_api.rs`).
pub(crate) unsafe fn pull_sparse(
    kv: *const SynkvKV,
    num: u32,
    keys: KeyArg,
    counts: *const u32,
    outs: *const *mut SynkvArray,
    priority: c_int,
    ignore_sparse: c_int,
    skipped: *mut u32,
) -> CResult {
    // SAFETY: forwarded from the exported function's contract.
    unsafe { pull(kv, num, keys, counts, outs, priority, ignore_sparse != 0, skipped) }
}

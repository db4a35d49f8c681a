//! [`SynkvKV`]: the store handle, and the store functions that take no key list: create, close,
//! free, type, rank, num_workers, barrier, wait_all, set_updater, clear_updater.
//!
//! The keyed operations (init, push, pull, …) are in `ops.rs`.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use synkv::{KVStore, NDArray};

use crate::error::{guard, CError, CResult};
use crate::ptr;
use crate::updater::{
    updater_fn, Callbacks, Pump, SynkvStrUpdater, SynkvUpdater, SYNKV_UPDATER_CALLER_THREAD, SYNKV_UPDATER_ENGINE_THREAD,
};

/// A store handle (opaque to C). Create with `synkv_kv_create`, free with `synkv_kv_free`.
pub struct SynkvKV {
    pub(crate) kv: KVStore,
    type_name: CString,
    pub(crate) pump: Arc<Pump>,
    /// Whether the installed updater runs on the caller's thread.
    caller_thread: Mutex<bool>,
    /// Every callback set ever installed and possibly still referenced by pending pushes.
    installed: Mutex<Vec<Weak<Callbacks>>>,
}

impl std::fmt::Debug for SynkvKV {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SynkvKV").field("kv", &self.kv).field("caller_thread", &self.caller_thread_updater()).finish_non_exhaustive()
    }
}

impl SynkvKV {
    pub(crate) fn caller_thread_updater(&self) -> bool {
        *self.caller_thread.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_caller_thread(&self, on: bool) {
        *self.caller_thread.lock().unwrap_or_else(PoisonError::into_inner) = on;
    }
}

/// Waits for every pending operation on `arrays`; returns the first error, after waiting for
/// all of them (so no operation still touches caller memory when this returns).
pub(crate) fn wait_arrays(arrays: &[NDArray]) -> CResult {
    let mut first = Ok(());
    for a in arrays {
        if let Err(e) = a.wait_to_write() {
            if first.is_ok() {
                first = Err(CError::from(e));
            }
        }
    }
    first
}

/// # Safety
/// `kv` is NULL or a live store handle.
pub(crate) unsafe fn store<'a>(kv: *const SynkvKV) -> CResult<&'a SynkvKV> {
    // SAFETY: forwarded from the caller's contract.
    unsafe { ptr::as_ref(kv, "kv") }
}

/// Creates a store: `local`, `device`, or one of MXNet's aliases (`local_update_cpu`,
/// `local_allreduce_cpu`, `local_allreduce_device`); case-insensitive (MXNet's
/// `MXKVStoreCreate`).
///
/// # Safety
/// `type_name` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_create(type_name: *const c_char, out: *mut *mut SynkvKV) -> c_int {
    static LOG: std::sync::Once = std::sync::Once::new();
    // The core's log (a dist worker's lost nodes, a straggler report) goes to stderr at
    // `SYNKV_LOG`'s level (default `warn`), unless the process has a logger already.
    LOG.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("SYNKV_LOG").unwrap_or_else(|_| "warn".into());
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).try_init();
    });
    guard(|| {
        // SAFETY: NUL-terminated by contract.
        let name = unsafe { ptr::str(type_name, "type") }?;
        let kv = synkv::create(name)?;
        let type_name = CString::new(kv.type_name()).map_err(|_| CError::argument("type contains a NUL byte"))?;
        let handle = SynkvKV { kv, type_name, pump: Arc::default(), caller_thread: Mutex::new(false), installed: Mutex::new(Vec::new()) };
        // SAFETY: writable by contract.
        unsafe { ptr::write_out(out, Box::into_raw(Box::new(handle)), "out") }
    })
}

/// Closes a store: waits for its pending operations and, on a dist store, leaves the cluster —
/// tells the scheduler this worker is done and waits until every worker is (however long;
/// only a dead node ends the wait early, with an error). The handle stays valid but refuses
/// further distributed operations; free it with `synkv_kv_free`. Closing twice is a no-op.
///
/// # Safety
/// `kv` is a live store handle.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_close(kv: *const SynkvKV) -> c_int {
    guard(|| {
        // SAFETY: a live handle by contract.
        let s = unsafe { store(kv) }?;
        s.kv.close()?;
        Ok(())
    })
}

/// Frees a store (NULL is a no-op), closing it first (`synkv_kv_close`). Returns once no
/// updater callback of this store can run any more, so `user_data` may be released afterwards.
/// The handle is freed even when closing fails; the status then says why (a dist worker that
/// could not leave the cluster cleanly should exit with a failure).
///
/// # Safety
/// `kv` is NULL or a live store handle that is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_free(kv: *mut SynkvKV) -> c_int {
    guard(|| {
        if kv.is_null() {
            return Ok(());
        }
        // SAFETY: a live handle made by `Box::into_raw`, given up by the caller.
        let handle = unsafe { Box::from_raw(kv) };
        let closed = handle.kv.close();
        let installed = std::mem::take(&mut *handle.installed.lock().unwrap_or_else(PoisonError::into_inner));
        drop(handle);
        // Pending pushes hold the updater closures (and through them the callbacks); they
        // are dropped when the last such push has run.
        while installed.iter().any(|w| w.strong_count() > 0) {
            std::thread::sleep(Duration::from_micros(200));
        }
        closed?;
        Ok(())
    })
}

/// The store's type name as given to `synkv_kv_create`, lower-cased (MXNet's
/// `MXKVStoreGetType`). The string lives as long as the store.
///
/// # Safety
/// `kv` is a live store handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_type(kv: *const SynkvKV, out: *mut *const c_char) -> c_int {
    guard(|| {
        // SAFETY: a live handle and a writable `out` by contract.
        unsafe { ptr::write_out(out, store(kv)?.type_name.as_ptr(), "out") }
    })
}

/// This worker's rank (0 for in-process stores; MXNet's `MXKVStoreGetRank`).
///
/// # Safety
/// `kv` is a live store handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_rank(kv: *const SynkvKV, out: *mut c_int) -> c_int {
    guard(|| {
        // SAFETY: a live handle by contract.
        let rank = c_int::try_from(unsafe { store(kv) }?.kv.rank()).map_err(|_| CError::argument("rank overflows int"))?;
        // SAFETY: writable by contract.
        unsafe { ptr::write_out(out, rank, "out") }
    })
}

/// The number of workers (1 for in-process stores; MXNet's `MXKVStoreGetGroupSize`).
///
/// # Safety
/// `kv` is a live store handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_num_workers(kv: *const SynkvKV, out: *mut c_int) -> c_int {
    guard(|| {
        // SAFETY: a live handle by contract.
        let n = c_int::try_from(unsafe { store(kv) }?.kv.num_workers()).map_err(|_| CError::argument("worker count overflows int"))?;
        // SAFETY: writable by contract.
        unsafe { ptr::write_out(out, n, "out") }
    })
}

/// A barrier across workers (a no-op for in-process stores; MXNet's `MXKVStoreBarrier`).
///
/// # Safety
/// `kv` is a live store handle.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_barrier(kv: *const SynkvKV) -> c_int {
    // SAFETY: a live handle by contract.
    guard(|| Ok(unsafe { store(kv) }?.kv.barrier()?))
}

/// Takes a consistent checkpoint of a dist job's servers into the directory `dir` (every worker
/// calls it at the same point of training, like a barrier) and writes its id and round (rank
/// 0's push calls before it) to `out_id` / `out_round` (either may be NULL). A job started with
/// `SYNKV_CHECKPOINT_DIR=dir` resumes from the newest checkpoint. An in-process store refuses.
///
/// # Safety
/// `kv` is a live store handle; `dir` is a NUL-terminated string; `out_id` and `out_round` are
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_checkpoint(kv: *const SynkvKV, dir: *const c_char, out_id: *mut u64, out_round: *mut u64) -> c_int {
    guard(|| {
        // SAFETY: a live handle and a NUL-terminated string by contract.
        let (h, dir) = unsafe { (store(kv)?, ptr::str(dir, "dir")?) };
        let info = h.kv.checkpoint(dir)?;
        // SAFETY: NULL or writable by contract.
        unsafe {
            if !out_id.is_null() {
                out_id.write(info.id);
            }
            if !out_round.is_null() {
                out_round.write(info.round);
            }
        }
        Ok(())
    })
}

/// The round of the checkpoint this dist job resumed from (`SYNKV_CHECKPOINT_DIR`), written
/// to `out`; -1 when the job started fresh (or the store is in-process).
///
/// # Safety
/// `kv` is a live store handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_resumed_round(kv: *const SynkvKV, out: *mut i64) -> c_int {
    guard(|| {
        // SAFETY: a live handle by contract.
        let round = unsafe { store(kv) }?.kv.resumed_round().map_or(-1, |r| i64::try_from(r).unwrap_or(i64::MAX));
        // SAFETY: writable by contract.
        unsafe { ptr::write_out(out, round, "out") }
    })
}

/// Waits for every pending operation in the process (all stores) and returns the first error
/// an operation raised since the previous `wait_all`, clearing it.
///
/// # Safety
/// `kv` is a live store handle.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_wait_all(kv: *const SynkvKV) -> c_int {
    // SAFETY: a live handle by contract.
    guard(|| Ok(unsafe { store(kv) }?.kv.wait_all()?))
}

/// Installs an updater (MXNet's `MXKVStoreSetUpdaterEx`): `int_fn` is called for int keys,
/// `str_fn` for str keys (either may be NULL, not both), each as
/// `(key, recv, stored, user_data)` once per key per push, one call at a time. `thread` is
/// `SYNKV_UPDATER_ENGINE_THREAD` (call on an engine thread) or `SYNKV_UPDATER_CALLER_THREAD`
/// (call on the thread inside `push`/`pushpull`, which then returns after its updates ran).
/// Pushes already scheduled keep the updater they were scheduled with.
///
/// # Safety
/// The function pointers are valid for their signatures; they and `user_data` stay usable
/// from the chosen thread until `synkv_kv_free` returns (or, after replacing the updater, until
/// `synkv_kv_wait_all`). Callbacks must return normally (no `longjmp` across synkv frames) and
/// must not call store functions.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_set_updater(
    kv: *mut SynkvKV,
    int_fn: SynkvUpdater,
    str_fn: SynkvStrUpdater,
    user_data: *mut c_void,
    thread: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: a live handle by contract.
        let h = unsafe { store(kv) }?;
        let on_caller = match thread {
            SYNKV_UPDATER_ENGINE_THREAD => false,
            SYNKV_UPDATER_CALLER_THREAD => true,
            other => return Err(CError::argument(format!("unknown updater thread mode {other}; use SYNKV_UPDATER_*_THREAD"))),
        };
        // SAFETY: forwarded from this function's contract.
        let callbacks = Arc::new(unsafe { Callbacks::new(int_fn, str_fn, user_data) }?);
        {
            let mut installed = h.installed.lock().unwrap_or_else(PoisonError::into_inner);
            installed.retain(|w| w.strong_count() > 0);
            installed.push(Arc::downgrade(&callbacks));
        }
        h.set_caller_thread(on_caller);
        h.kv.set_updater(updater_fn(callbacks, on_caller.then(|| Arc::clone(&h.pump))));
        Ok(())
    })
}

/// Removes the updater: pushes assign the sum of the pushed values again.
///
/// # Safety
/// `kv` is a live store handle.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_clear_updater(kv: *mut SynkvKV) -> c_int {
    guard(|| {
        // SAFETY: a live handle by contract.
        let h = unsafe { store(kv) }?;
        h.kv.clear_updater();
        h.set_caller_thread(false);
        Ok(())
    })
}

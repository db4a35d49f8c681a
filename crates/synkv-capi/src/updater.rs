//! Updater callbacks: C function pointers wrapped into a synkv updater, and the *pump* that
//! runs them on the caller's thread when the language behind them cannot be entered from
//! another thread (Perl, most embedded interpreters).
//!
//! synkv calls an updater on an engine thread, once per key per push, one call at a time. For
//! each call the wrapper copies the merged value (`recv`) and the stored value into fresh
//! handles, calls the C function with them, and on success stores the `stored` handle's array
//! back as the key's value (synkv checks shape, dtype and storage). The handles are borrowed
//! for the call only: the callback must not free them or keep them.
//!
//! Threads ([`SYNKV_UPDATER_ENGINE_THREAD`] / [`SYNKV_UPDATER_CALLER_THREAD`]):
//! - *engine*: the callback runs on the engine thread (MXNet's behaviour);
//! - *caller*: the engine thread hands the call to [`Pump`] and blocks; the thread inside the
//!   `push`/`pushpull` call that scheduled the work serves the pump until its work is done.
//!   Such calls therefore return only once their updates have run.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, PoisonError};

use synkv::{Key, NDArray};

use crate::array::SynkvArray;
use crate::error::{clear_last_error, last_error, CError, CResult};

/// Run updater callbacks on the engine thread that performs the update.
pub const SYNKV_UPDATER_ENGINE_THREAD: c_int = 0;
/// Run updater callbacks on the thread that called `push` / `pushpull`; those calls then
/// return after their updates ran. For runtimes that cannot be entered from foreign threads.
pub const SYNKV_UPDATER_CALLER_THREAD: c_int = 1;

/// An updater for int keys: `(key, recv, stored, user_data)`; change `stored` in place (through
/// `synkv_array_data`, `synkv_array_write` or `synkv_array_row_sparse_set`) and return 0, or
/// return non-zero (after `synkv_set_last_error`) to fail the update. `recv` and `stored` are
/// borrowed for the call only.
pub type SynkvUpdater =
    Option<unsafe extern "C" fn(key: i32, recv: *mut SynkvArray, stored: *mut SynkvArray, user_data: *mut c_void) -> c_int>;

/// An updater for str keys: as [`SynkvUpdater`], with the key as a NUL-terminated string
/// borrowed for the call.
pub type SynkvStrUpdater =
    Option<unsafe extern "C" fn(key: *const c_char, recv: *mut SynkvArray, stored: *mut SynkvArray, user_data: *mut c_void) -> c_int>;

/// The caller's `user_data` pointer.
#[derive(Clone, Copy)]
struct UserData(*mut c_void);

// SAFETY: `synkv_kv_set_updater`'s contract: the callbacks and `user_data` may be used from any
// thread (one call at a time); this crate only passes the pointer back to them.
unsafe impl Send for UserData {}
// SAFETY: as above.
unsafe impl Sync for UserData {}

/// The callbacks given to one `synkv_kv_set_updater` call.
pub(crate) struct Callbacks {
    int_fn: SynkvUpdater,
    str_fn: SynkvStrUpdater,
    user_data: UserData,
}

impl Callbacks {
    /// # Safety
    /// The function pointers are valid for their signatures, and they and `user_data` may be
    /// used from any thread (one call at a time) as long as synkv may call them.
    pub(crate) unsafe fn new(int_fn: SynkvUpdater, str_fn: SynkvStrUpdater, user_data: *mut c_void) -> CResult<Callbacks> {
        if int_fn.is_none() && str_fn.is_none() {
            return Err(CError::null("both int_fn and str_fn (use synkv_kv_clear_updater to remove the updater)"));
        }
        Ok(Callbacks { int_fn, str_fn, user_data: UserData(user_data) })
    }

    /// Calls the callback for `key` on this thread.
    fn invoke(&self, key: &Key, recv: &SynkvArray, stored: &SynkvArray) -> Result<(), String> {
        let (recv, stored) = (std::ptr::from_ref(recv).cast_mut(), std::ptr::from_ref(stored).cast_mut());
        clear_last_error();
        let rc = match key {
            Key::Int(k) => {
                let f = self.int_fn.ok_or("the store uses int keys but no int-key callback was given to synkv_kv_set_updater")?;
                // SAFETY: `Callbacks::new`'s contract; the handles outlive the call.
                unsafe { f(*k, recv, stored, self.user_data.0) }
            }
            Key::Str(s) => {
                let f = self.str_fn.ok_or("the store uses str keys but no str-key callback was given to synkv_kv_set_updater")?;
                let c = CString::new(s.as_str()).map_err(|_| format!("key {s:?} contains a NUL byte"))?;
                // SAFETY: as above; `c` outlives the call.
                unsafe { f(c.as_ptr(), recv, stored, self.user_data.0) }
            }
        };
        if rc == 0 {
            return Ok(());
        }
        let msg = last_error();
        Err(if msg.is_empty() { format!("updater callback returned {rc}") } else { format!("updater callback returned {rc}: {msg}") })
    }
}

/// Builds the synkv updater closure for `callbacks`; `pump` is `Some` in caller-thread mode.
pub(crate) fn updater_fn(
    callbacks: Arc<Callbacks>,
    pump: Option<Arc<Pump>>,
) -> impl Fn(&Key, &NDArray, &mut NDArray) -> synkv::Result<()> + Send + Sync + 'static {
    move |key: &Key, recv: &NDArray, stored: &mut NDArray| {
        let fail = |e: CError| synkv::Error::other(e.message);
        let recv_h = Arc::new(SynkvArray::copy_of(recv).map_err(fail)?);
        let stored_h = Arc::new(SynkvArray::copy_of(stored).map_err(fail)?);
        let outcome = match &pump {
            None => callbacks.invoke(key, &recv_h, &stored_h),
            Some(pump) => {
                let (tx, rx) = mpsc::sync_channel(1);
                let (cb, k, r, s) = (Arc::clone(&callbacks), key.clone(), Arc::clone(&recv_h), Arc::clone(&stored_h));
                pump.submit(Box::new(move || {
                    let res = catch_unwind(AssertUnwindSafe(|| cb.invoke(&k, &r, &s)))
                        .unwrap_or_else(|_| Err("updater callback panicked".into()));
                    let _ = tx.send(res);
                }));
                // A job dropped unserved closes the channel: an error, never a hang.
                rx.recv().unwrap_or_else(|_| Err("the updater call was dropped before it ran".into()))
            }
        };
        outcome.map_err(synkv::Error::other)?;
        *stored = stored_h.array();
        Ok(())
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Updater calls waiting for a caller thread to run them.
#[derive(Default)]
pub(crate) struct Pump {
    jobs: Mutex<VecDeque<Job>>,
    wake: Condvar,
}

impl Pump {
    fn submit(&self, job: Job) {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner).push_back(job);
        self.wake.notify_all();
    }

    /// Serves updater calls on this thread until every operation on `arrays` pushed so far has
    /// completed and every update of `kv` scheduled so far has run (a push consumes its values
    /// before its update runs); returns the first error the waits on `arrays` reported.
    pub(crate) fn serve_until_done(&self, kv: &synkv::KVStore, arrays: Vec<NDArray>) -> CResult {
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                let result = crate::store::wait_arrays(&arrays);
                kv.wait_updates();
                // Set the flag under the lock so the server cannot miss the wake-up.
                let guard = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
                done.store(true, Ordering::SeqCst);
                drop(guard);
                self.wake.notify_all();
                result
            });
            let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if let Some(job) = jobs.pop_front() {
                    drop(jobs);
                    job();
                    jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
                } else if done.load(Ordering::SeqCst) {
                    break;
                } else {
                    jobs = self.wake.wait(jobs).unwrap_or_else(PoisonError::into_inner);
                }
            }
            drop(jobs);
            waiter.join().unwrap_or_else(|_| Err(CError::argument("waiting for the push panicked")))
        })
    }
}

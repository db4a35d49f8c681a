//! [`Engine`]: the public handle — pushing ops, waiting for them, the process-wide engine.
//!
//! A handle is an `Arc` around the pool's [`Shared`] state plus the worker threads' join
//! handles. Dropping the last handle asks the workers to exit once every op pushed to the engine
//! has finished (an async op counts until its `Completion` is used or dropped), and joins them.
//! When the drop happens on one of the engine's own workers, which cannot join itself, the
//! workers are detached instead and exit on their own once drained.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::error::{BoxError, Error};
use super::op::{Completion, Op, Priority, ReadLease, Work};
use super::pool::{self, Shared};
use super::var::{Access, Var, WaitStart};

/// Environment variable giving the global engine's thread count.
pub(crate) const THREADS_ENV: &str = "SYNKV_ENGINE_THREADS";

/// Serialises the enqueueing of ops with two or more vars, process-wide (vars are shared across
/// engines). Without it, two threads pushing ops on `{a, b}` could enqueue in opposite orders on
/// `a` and `b` and wait on each other forever. Single-var ops and waits need no such lock.
static PUSH_ORDER: Mutex<()> = parking_lot::const_mutex(());

/// The engine: a thread pool plus per-variable queues.
///
/// Cheap to clone (an `Arc`); dropping the last clone drains and stops the pool.
#[derive(Clone)]
pub struct Engine(Arc<Handle>);

struct Handle {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.shut_down();
        let workers = std::mem::take(&mut *self.workers.lock());
        if self.shared.is_own_worker() {
            return; // detached: they exit once drained
        }
        for worker in workers {
            // A worker never panics (op panics are caught); nothing useful to do if one did.
            let _ = worker.join();
        }
    }
}

impl Engine {
    /// A new engine with `threads` pool threads (at least 1).
    pub fn new(threads: usize) -> Engine {
        let threads = threads.max(1);
        let shared = Arc::new(Shared::new(threads));
        let workers = (0..threads).map(|i| pool::spawn_worker(Arc::clone(&shared), i)).collect();
        Engine(Arc::new(Handle { shared, workers: Mutex::new(workers) }))
    }

    /// The process-wide engine (`SYNKV_ENGINE_THREADS`, default: available parallelism).
    pub fn global() -> &'static Engine {
        static GLOBAL: OnceLock<Engine> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let value = std::env::var(THREADS_ENV).ok();
            Engine::new(threads_from(value.as_deref()))
        })
    }

    /// The number of pool threads.
    pub fn threads(&self) -> usize {
        self.0.shared.threads()
    }

    /// Schedules a synchronous operation.
    pub fn push<F>(&self, name: &'static str, reads: &[Var], writes: &[Var], priority: Priority, f: F)
    where
        F: FnOnce() -> Result<(), BoxError> + Send + 'static,
    {
        self.submit(name, reads, writes, priority, Work::Sync(Box::new(f)));
    }

    /// Like [`Engine::push`], but an error this op inherits from a var it only reads is moved
    /// rather than copied: the read var's error is cleared when the op is granted, and travels
    /// on to this op's write vars. A store's pull uses it, so a failed update is reported once,
    /// on the pulled outputs, and the key is readable again afterwards.
    pub fn push_taking_errors<F>(&self, name: &'static str, reads: &[Var], writes: &[Var], priority: Priority, f: F)
    where
        F: FnOnce() -> Result<(), BoxError> + Send + 'static,
    {
        self.submit_with(name, reads, writes, priority, Work::Sync(Box::new(f)), true);
    }

    /// Schedules an asynchronous operation: it runs on the pool and finishes when `Completion` is used.
    pub fn push_async<F>(&self, name: &'static str, reads: &[Var], writes: &[Var], priority: Priority, f: F)
    where
        F: FnOnce(Completion) + Send + 'static,
    {
        self.submit(name, reads, writes, priority, Work::Async(Box::new(f)));
    }

    /// Like [`Engine::push_async`], but the vars the op only reads are released as soon as `f`
    /// returns, before the op completes: `f` must be done with them by then (it copied what it
    /// needs). Waiting to write such a var then returns once `f` has run, while waits on the
    /// op's write vars still wait for its `Completion`. A distributed push uses it: it copies or
    /// quantizes the pushed arrays, hands the bytes to the network and returns, so the caller
    /// may reuse its arrays long before the servers answer.
    pub fn push_async_consuming<F>(&self, name: &'static str, reads: &[Var], writes: &[Var], priority: Priority, f: F)
    where
        F: FnOnce(Completion) + Send + 'static,
    {
        // A lease given back as soon as `f` returns (or unwinds).
        self.push_async_lending(name, reads, writes, priority, move |done, lease| {
            f(done);
            drop(lease);
        });
    }

    /// Like [`Engine::push_async`], but `f` also receives a [`ReadLease`]: the vars the op only
    /// reads stay held until the lease is dropped — earlier than the op's completion, or later.
    /// A distributed push lends the pushed arrays' memory to the network writer this way (no
    /// copy): the lease travels with the bytes and is dropped once they are written out, so a
    /// later write of the array waits exactly until then, not for the servers' answers.
    pub fn push_async_lending<F>(&self, name: &'static str, reads: &[Var], writes: &[Var], priority: Priority, f: F)
    where
        F: FnOnce(Completion, ReadLease) + Send + 'static,
    {
        let work = Work::Async(Box::new(move |done: Completion| match done.lease() {
            Some(lease) => f(done, lease),
            None => done.fail("the operation had no lease to give".into()),
        }));
        self.submit(name, reads, writes, priority, work);
    }

    fn submit(&self, name: &'static str, reads: &[Var], writes: &[Var], priority: Priority, work: Work) {
        self.submit_with(name, reads, writes, priority, work, false);
    }

    fn submit_with(&self, name: &'static str, reads: &[Var], writes: &[Var], priority: Priority, work: Work, takes_errors: bool) {
        let shared = &self.0.shared;
        let mut op = Op::new(name, priority, access_list(reads, writes), work, Arc::clone(shared));
        op.takes_errors = takes_errors;
        let op = Arc::new(op);
        shared.op_pushed();
        let granted = {
            let _order = (op.vars.len() > 1).then(|| PUSH_ORDER.lock());
            let mut granted = 0;
            for (idx, (var, access)) in op.vars.iter().enumerate() {
                let idx = u32::try_from(idx).unwrap_or(u32::MAX);
                granted += usize::from(var.enqueue(&op, *access, idx));
            }
            granted
        };
        if op.release_deps(granted + 1) {
            pool::schedule(op, false);
        }
    }

    /// Waits until every write to `var` pushed before this call has completed; returns (and clears) the var's error.
    ///
    /// # Panics
    /// When called from inside an unfinished op that writes `var` (a certain deadlock).
    pub fn wait_to_read(&self, var: &Var) -> Result<(), Error> {
        wait_var(var, false)
    }

    /// Waits until every read and write of `var` pushed before this call has completed; returns (and clears) the var's error.
    ///
    /// # Panics
    /// When called from inside an unfinished op that reads or writes `var` (a certain deadlock).
    pub fn wait_to_write(&self, var: &Var) -> Result<(), Error> {
        wait_var(var, true)
    }

    /// Starts a [`wait_to_write`](Engine::wait_to_write) without blocking: the returned
    /// [`PendingWait`] completes once every read and write of `var` pushed before this call
    /// has completed, and then holds (having cleared it) the var's error.
    ///
    /// The wait is queued on the var like an op: ops pushed on `var` after this call are
    /// granted after it, so they never delay it (and it delays them only by the ordering a
    /// write would impose). Dropping the `PendingWait` unfinished discards the error it
    /// would have returned.
    ///
    /// # Panics
    /// When called from inside an unfinished op that reads or writes `var` (a certain deadlock).
    pub fn begin_wait_to_write(&self, var: &Var) -> PendingWait {
        check_wait_from_op(var, true, "begin_wait_to_write");
        PendingWait(var.begin_wait(true))
    }

    /// Waits until every operation pushed before this call has completed; returns (and clears) the first error raised since the last `wait_all`.
    ///
    /// This waits until the engine has no unfinished op, so ops other threads push meanwhile
    /// are waited for too.
    ///
    /// # Panics
    /// When called from inside the closure of an op running on this engine (a certain
    /// deadlock: the op counts as unfinished until its closure returns).
    pub fn wait_all(&self) -> Result<(), Error> {
        let shared = &self.0.shared;
        if let Some(op) = pool::running_op() {
            if Arc::ptr_eq(&op.engine, shared) {
                panic!(
                    "synkv engine: `wait_all` called from inside operation `{}` on the same \
                     engine, which cannot finish while it waits; wait on specific vars instead",
                    op.name
                );
            }
        }
        shared.wait_idle()
    }
}

fn wait_var(var: &Var, write: bool) -> Result<(), Error> {
    check_wait_from_op(var, write, if write { "wait_to_write" } else { "wait_to_read" });
    PendingWait(var.begin_wait(write)).wait()
}

/// Panics when the calling thread runs an unfinished op that must finish before a wait on
/// `var` can (a certain deadlock).
fn check_wait_from_op(var: &Var, write: bool, what: &str) {
    if let Some(op) = pool::running_op() {
        if !op.is_finished() && op.blocks_wait(var, write) {
            panic!(
                "synkv engine: `{what}` called from inside operation `{}`, which uses that var and \
                 must finish first (deadlock)",
                op.name
            );
        }
    }
}

/// A wait started by [`Engine::begin_wait_to_write`]: poll it with
/// [`is_done`](PendingWait::is_done), or block with [`wait`](PendingWait::wait).
pub struct PendingWait(WaitStart);

impl PendingWait {
    /// Whether the wait has completed (then [`wait`](PendingWait::wait) returns at once).
    pub fn is_done(&self) -> bool {
        match &self.0 {
            WaitStart::Done(_) => true,
            WaitStart::Pending(waiter) => waiter.is_granted(),
        }
    }

    /// Blocks until the wait completes; returns the var's error recorded at that moment.
    pub fn wait(self) -> Result<(), Error> {
        match self.0 {
            WaitStart::Done(result) => result,
            WaitStart::Pending(waiter) => waiter.wait(),
        }
    }
}

impl fmt::Debug for PendingWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingWait").field("done", &self.is_done()).finish()
    }
}

/// Deduplicated `(var, access)` pairs: reads first in `reads` order, then the remaining writes;
/// a var in both lists becomes [`Access::ReadWrite`].
fn access_list(reads: &[Var], writes: &[Var]) -> Vec<(Var, Access)> {
    let mut list: Vec<(Var, Access)> = Vec::with_capacity(reads.len() + writes.len());
    // Linear scans for the usual handful of vars; a map keeps big lists O(n).
    let n = reads.len() + writes.len();
    let mut index: Option<FxHashMap<usize, usize>> = (n > 16).then(|| FxHashMap::with_capacity_and_hasher(n, Default::default()));
    let mut find = |list: &Vec<(Var, Access)>, var: &Var| match &mut index {
        Some(map) => {
            let next = list.len();
            match map.entry(var.key()) {
                std::collections::hash_map::Entry::Occupied(e) => Some(*e.get()),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(next);
                    None
                }
            }
        }
        None => list.iter().position(|(v, _)| v.same(var)),
    };
    for var in reads {
        if find(&list, var).is_none() {
            list.push((var.clone(), Access::Read));
        }
    }
    for var in writes {
        match find(&list, var) {
            Some(i) => {
                if list[i].1 == Access::Read {
                    list[i].1 = Access::ReadWrite;
                }
            }
            None => list.push((var.clone(), Access::Write)),
        }
    }
    list
}

/// The global engine's thread count for the `SYNKV_ENGINE_THREADS` value `value`: a positive
/// integer, or else the available parallelism.
pub(crate) fn threads_from(value: Option<&str>) -> usize {
    value
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &self.0.shared;
        f.debug_struct("Engine")
            .field("threads", &shared.threads())
            .field("outstanding", &shared.outstanding())
            .field("errors", &shared.error_count())
            .finish()
    }
}

//! One pushed operation and the [`Completion`] an asynchronous one finishes through.
//!
//! An [`Op`] lives in an `Arc` shared by the var queues it waits in, the ready heap and (for an
//! async op) its `Completion`. Its `pending` counter starts at `#vars + 1`: each var grant takes
//! one, and the pusher takes the last after enqueueing everywhere, so whoever brings it to zero
//! schedules the op, exactly once. `finished` makes finishing idempotent (a completion racing a
//! caught panic). Finishing computes the outcome, records it on the written vars, releases every
//! var (collecting the ops that become runnable) and then tells the engine.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::error::{BoxError, Error};
use super::pool::{self, Shared};
use super::var::{Access, Var};

/// Scheduling priority: among ready operations, higher runs first.
pub type Priority = i32;

/// What an op runs.
pub(crate) enum Work {
    Sync(Box<dyn FnOnce() -> Result<(), BoxError> + Send + 'static>),
    Async(Box<dyn FnOnce(Completion) + Send + 'static>),
}

/// A pushed operation.
pub(crate) struct Op {
    pub(crate) name: &'static str,
    pub(crate) priority: Priority,
    /// Push order within the engine, for FIFO among equal priorities.
    pub(crate) seq: u64,
    /// Dependencies not yet granted, plus one held by the pusher until it has enqueued.
    pending: AtomicUsize,
    /// Deduplicated vars: reads first (in `reads` order), then writes.
    pub(crate) vars: Vec<(Var, Access)>,
    work: Mutex<Option<Work>>,
    /// The first error found on a read var when it was granted, with that var's index.
    inherited: Mutex<Option<(u32, Error)>>,
    finished: AtomicBool,
    /// Whether an error inherited from a read-only var is moved (cleared on that var).
    pub(crate) takes_errors: bool,
    /// Set by whoever releases the read-only vars first (the drop of a [`ReadLease`], or
    /// `finish`).
    reads_released: AtomicBool,
    /// Whether a [`ReadLease`] holds the read-only vars: then only its drop releases them,
    /// even after the op finished ([`Engine::push_async_lending`](super::Engine::push_async_lending)).
    pub(crate) leased: AtomicBool,
    /// The engine that runs it.
    pub(crate) engine: Arc<Shared>,
}

impl Op {
    pub(crate) fn new(name: &'static str, priority: Priority, vars: Vec<(Var, Access)>, work: Work, engine: Arc<Shared>) -> Op {
        Op {
            name,
            priority,
            seq: engine.next_seq(),
            pending: AtomicUsize::new(vars.len() + 1),
            vars,
            work: Mutex::new(Some(work)),
            inherited: Mutex::new(None),
            finished: AtomicBool::new(false),
            takes_errors: false,
            reads_released: AtomicBool::new(false),
            leased: AtomicBool::new(false),
            engine,
        }
    }

    /// Takes one dependency; true when it was the last (the caller must schedule the op).
    pub(crate) fn dependency_met(&self) -> bool {
        self.release_deps(1)
    }

    /// Takes `n` dependencies at once; true when they were the last.
    pub(crate) fn release_deps(&self, n: usize) -> bool {
        self.pending.fetch_sub(n, Ordering::AcqRel) == n
    }

    /// Records `err`, found on the read var at `idx`, unless an earlier read var's is known.
    pub(crate) fn inherit(&self, idx: u32, err: &Error) {
        let mut slot = self.inherited.lock();
        if !matches!(&*slot, Some((i, _)) if *i <= idx) {
            *slot = Some((idx, err.clone()));
        }
    }

    pub(crate) fn take_work(&self) -> Option<Work> {
        self.work.lock().take()
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Whether waiting on `var` (to write it, or to read it) needs this op to finish first.
    pub(crate) fn blocks_wait(&self, var: &Var, write: bool) -> bool {
        let reads_held = !self.reads_released.load(Ordering::Acquire);
        self.vars.iter().any(|(v, access)| v.same(var) && (access.writes() || (write && reads_held)))
    }

    /// Releases the read-only vars now (a lending op's [`ReadLease`] was dropped), unless that
    /// happened already; ops this makes runnable are scheduled.
    pub(crate) fn release_reads(&self) {
        if self.reads_released.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut ready = Ready::None;
        for (var, access) in self.vars.iter().filter(|(_, a)| !a.writes()) {
            var.release(*access, None, &mut ready);
        }
        ready.schedule(false);
    }

    /// Finishes the op with its own error `own` (None: it succeeded). Returns false when it had
    /// already finished. `tail` says the caller is a pool thread that ran this op and goes
    /// straight back to its run loop afterwards.
    pub(crate) fn finish(&self, own: Option<Error>, tail: bool) -> bool {
        if self.finished.swap(true, Ordering::AcqRel) {
            return false;
        }
        let inherited = self.inherited.lock().take().map(|(_, err)| err);
        let outcome = own.clone().or(inherited);
        if let Some(err) = own {
            self.engine.record_error(err);
        }
        let mut ready = Ready::None;
        // A lease keeps the reads past the op's end: its drop releases them.
        let reads_held = !self.leased.load(Ordering::Acquire) && !self.reads_released.swap(true, Ordering::AcqRel);
        for (var, access) in &self.vars {
            if access.writes() || reads_held {
                var.release(*access, outcome.as_ref(), &mut ready);
            }
        }
        ready.schedule(tail);
        self.engine.op_finished();
        true
    }
}

/// Ops made runnable while releasing vars, scheduled once the var locks are dropped.
/// Avoids an allocation for the common zero-or-one case.
pub(crate) enum Ready {
    None,
    One(Arc<Op>),
    Many(Vec<Arc<Op>>),
}

impl Ready {
    pub(crate) fn push(&mut self, op: Arc<Op>) {
        *self = match std::mem::replace(self, Ready::None) {
            Ready::None => Ready::One(op),
            Ready::One(first) => Ready::Many(vec![first, op]),
            Ready::Many(mut ops) => {
                ops.push(op);
                Ready::Many(ops)
            }
        };
    }

    fn schedule(self, tail: bool) {
        match self {
            Ready::None => {}
            Ready::One(op) => pool::schedule(op, tail),
            Ready::Many(ops) => {
                let mut tail = tail;
                for op in ops {
                    // Only the first may skip waking a sleeper: this thread takes it next.
                    pool::schedule(op, tail);
                    tail = false;
                }
            }
        }
    }
}

/// The read-only vars of a lending operation ([`Engine::push_async_lending`]
/// (super::Engine::push_async_lending)): they stay held, even after the operation completes,
/// until this is dropped. Whoever holds it may read the memory those vars guard.
pub struct ReadLease(Arc<Op>);

impl ReadLease {
    pub(crate) fn new(op: Arc<Op>) -> ReadLease {
        op.leased.store(true, Ordering::Release);
        ReadLease(op)
    }
}

impl fmt::Debug for ReadLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ReadLease").field(&self.0.name).finish()
    }
}

impl Drop for ReadLease {
    fn drop(&mut self) {
        self.0.release_reads();
    }
}

/// Handed to an asynchronous operation; completing it releases the operation's variables.
///
/// Use it exactly once, from any thread: [`done`](Completion::done) or
/// [`fail`](Completion::fail). Dropping it unused finishes the op with [`Error::Dropped`].
pub struct Completion(Option<Arc<Op>>);

impl Completion {
    pub(crate) fn new(op: Arc<Op>) -> Completion {
        Completion(Some(op))
    }

    /// The lease of the op's read-only vars (see [`ReadLease`]).
    pub(crate) fn lease(&self) -> Option<ReadLease> {
        self.0.as_ref().map(|op| ReadLease::new(Arc::clone(op)))
    }

    /// The operation succeeded.
    pub fn done(mut self) {
        if let Some(op) = self.0.take() {
            op.finish(None, false);
        }
    }

    /// The operation failed with `err`.
    pub fn fail(mut self, err: BoxError) {
        if let Some(op) = self.0.take() {
            op.finish(Some(Error::failed(op.name, err)), false);
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(op) = self.0.take() {
            // Unwinding out of the op's own closure: the pool thread catches the panic and
            // reports it as `Panicked`, which says more than `Dropped`.
            if std::thread::panicking() && pool::is_running(&op) {
                return;
            }
            op.finish(Some(Error::Dropped { op: op.name }), false);
        }
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion").field("op", &self.0.as_ref().map(|op| op.name)).finish()
    }
}

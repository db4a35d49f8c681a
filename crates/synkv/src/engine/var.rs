//! Variables: the unit of dependency tracking, one per array.
//!
//! A [`Var`] is an `Arc` around a small mutex-protected state: the queue of requests not yet
//! granted, how many granted reads are running, whether a granted write is running, and the
//! error the last write recorded. It knows nothing about engines or threads: granting an op
//! only decrements the op's pending-dependency counter, and the op that reaches zero is handed
//! back to the caller (in a [`Ready`] list) to be scheduled on its own engine.
//!
//! Invariants, all under the var's lock:
//! - `writing` implies `readers == 0`;
//! - the queue's front entry is not grantable, or the queue is empty: every release and every
//!   enqueue re-establishes this, so "queue empty and no conflict" is the fast path;
//! - entries are granted strictly in queue (= submission) order.
//!
//! Waits are queue entries too: a waiter is granted by the same rules as a read (for
//! `wait_to_read`) or a write (for `wait_to_write`), and is released the moment it is granted,
//! on the releasing thread, without needing a pool thread.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::error::Error;
use super::op::{Op, Ready};

/// A variable: the unit of dependency tracking (one per array).
///
/// Cheap to create (one small allocation) and to clone (an `Arc`). Variables are independent of
/// any [`Engine`](super::Engine): ops pushed to different engines may share them.
#[derive(Clone)]
pub struct Var(Arc<VarInner>);

/// The shared state behind a [`Var`].
struct VarInner {
    state: Mutex<VarState>,
}

/// How an op uses one of its vars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Listed in `reads` only.
    Read,
    /// Listed in `writes` only.
    Write,
    /// Listed in both: ordered as a write, and its recorded error propagates like a read's.
    ReadWrite,
}

impl Access {
    /// Whether this access is ordered as a write.
    pub(crate) fn writes(self) -> bool {
        !matches!(self, Access::Read)
    }

    /// Whether the var's recorded error propagates into the op.
    pub(crate) fn reads(self) -> bool {
        !matches!(self, Access::Write)
    }
}

/// One request waiting in a var's queue.
enum Entry {
    /// An op's read or write; `idx` is the var's position in the op's var list.
    Op { op: Arc<Op>, access: Access, idx: u32 },
    /// A thread blocked in `wait_to_read` (`write == false`) or `wait_to_write`.
    Wait { waiter: Arc<Waiter>, write: bool },
}

impl Entry {
    fn is_write(&self) -> bool {
        match self {
            Entry::Op { access, .. } => access.writes(),
            Entry::Wait { write, .. } => *write,
        }
    }
}

struct VarState {
    queue: VecDeque<Entry>,
    /// Granted reads not yet released.
    readers: usize,
    /// A granted write not yet released.
    writing: bool,
    /// The outcome of the last completed write, when it failed (boxed to keep vars small).
    error: Option<Box<Error>>,
}

impl VarState {
    fn can_grant(&self, write: bool) -> bool {
        !self.writing && (!write || self.readers == 0)
    }

    fn grant_op(&mut self, op: &Op, access: Access, idx: u32) {
        if access.writes() {
            self.writing = true;
        } else {
            self.readers += 1;
        }
        // Snapshot now: no write can change the error while this grant is held, but a wait may
        // clear it, and the op must not depend on when that happens.
        if access.reads() {
            if let Some(err) = &self.error {
                op.inherit(idx, err);
                // A taking op moves the error on to its write vars: reported once downstream.
                if op.takes_errors && !access.writes() {
                    self.error = None;
                }
            }
        }
    }

    fn take_error(&mut self) -> Result<(), Error> {
        match self.error.take() {
            Some(err) => Err(*err),
            None => Ok(()),
        }
    }

    /// Grants queue entries from the front while the rules allow.
    fn pump(&mut self, ready: &mut Ready) {
        while let Some(front) = self.queue.front() {
            if !self.can_grant(front.is_write()) {
                break;
            }
            let Some(entry) = self.queue.pop_front() else {
                break;
            };
            match entry {
                Entry::Op { op, access, idx } => {
                    self.grant_op(&op, access, idx);
                    if op.dependency_met() {
                        ready.push(op);
                    }
                }
                // Granted and released at once: it holds nothing.
                Entry::Wait { waiter, .. } => waiter.wake(self.take_error()),
            }
        }
    }
}

/// How a wait starts: finished already, or queued behind earlier requests.
pub(crate) enum WaitStart {
    Done(Result<(), Error>),
    Pending(Arc<Waiter>),
}

/// A thread blocked until its wait entry is granted.
pub(crate) struct Waiter {
    slot: Mutex<Option<Result<(), Error>>>,
    cv: Condvar,
}

impl Waiter {
    fn wake(&self, result: Result<(), Error>) {
        *self.slot.lock() = Some(result);
        self.cv.notify_one();
    }

    /// Whether it has been granted (a later [`Waiter::wait`] returns at once).
    pub(crate) fn is_granted(&self) -> bool {
        self.slot.lock().is_some()
    }

    /// Blocks until granted; returns the var's error at that moment (which the grant cleared).
    pub(crate) fn wait(&self) -> Result<(), Error> {
        let mut slot = self.slot.lock();
        loop {
            if let Some(result) = slot.take() {
                return result;
            }
            self.cv.wait(&mut slot);
        }
    }
}

impl Var {
    /// A fresh variable with no pending operations.
    pub fn new() -> Var {
        Var(Arc::new(VarInner { state: Mutex::new(VarState { queue: VecDeque::new(), readers: 0, writing: false, error: None }) }))
    }

    /// Whether `self` and `other` are the same variable.
    pub fn same(&self, other: &Var) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// An identity usable as a hash key while the var is alive.
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// Adds `op`'s request; returns whether it was granted immediately.
    pub(crate) fn enqueue(&self, op: &Arc<Op>, access: Access, idx: u32) -> bool {
        let mut st = self.0.state.lock();
        if st.queue.is_empty() && st.can_grant(access.writes()) {
            st.grant_op(op, access, idx);
            true
        } else {
            st.queue.push_back(Entry::Op { op: Arc::clone(op), access, idx });
            false
        }
    }

    /// Releases a grant held by a finished op; a write records `outcome`. Ops this makes
    /// runnable are added to `ready`.
    pub(crate) fn release(&self, access: Access, outcome: Option<&Error>, ready: &mut Ready) {
        let mut st = self.0.state.lock();
        if access.writes() {
            debug_assert!(st.writing, "released a write that was not granted");
            st.writing = false;
            st.error = outcome.map(|e| Box::new(e.clone()));
        } else {
            debug_assert!(st.readers > 0, "released a read that was not granted");
            st.readers -= 1;
        }
        st.pump(ready);
    }

    /// Starts a wait for every earlier write (`write == false`) or every earlier request.
    pub(crate) fn begin_wait(&self, write: bool) -> WaitStart {
        let mut st = self.0.state.lock();
        if st.queue.is_empty() && st.can_grant(write) {
            return WaitStart::Done(st.take_error());
        }
        let waiter = Arc::new(Waiter { slot: Mutex::new(None), cv: Condvar::new() });
        st.queue.push_back(Entry::Wait { waiter: Arc::clone(&waiter), write });
        WaitStart::Pending(waiter)
    }
}

impl Default for Var {
    fn default() -> Self {
        Var::new()
    }
}

impl fmt::Debug for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Var");
        d.field("id", &format_args!("{:#x}", self.key()));
        // Never block in Debug: the var may be locked by the thread that is printing it.
        match self.0.state.try_lock() {
            Some(st) => d
                .field("queued", &st.queue.len())
                .field("readers", &st.readers)
                .field("writing", &st.writing)
                .field("error", &st.error.as_deref()),
            None => d.field("state", &"<locked>"),
        };
        d.finish()
    }
}

//! The worker pool: a priority heap of runnable ops and the threads that run them.
//!
//! [`Shared`] is the part of an engine that ops and workers point to; the public
//! [`Engine`](super::Engine) handle owns the threads and shuts them down when dropped. Shared
//! state here: the run queue (one short mutex: push or pop, never held while an op runs), the
//! count of pushed-but-unfinished ops (for `wait_all` and draining at shutdown), and the log of
//! errors ops raised themselves.
//!
//! Workers catch panics from op closures, so a failing op never kills a pool thread. Two
//! thread-locals let the rest of the engine ask "is this a worker of that engine?" (to skip a
//! needless wake-up) and "which op is this thread running?" (to detect certain deadlocks).

use std::cell::{Cell, RefCell};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use super::error::Error;
use super::op::{Completion, Op, Priority, Work};

thread_local! {
    /// The `Shared` this thread is a worker of (its address), or 0.
    static WORKER_OF: Cell<usize> = const { Cell::new(0) };
    /// The op whose closure this thread is running.
    static RUNNING: RefCell<Option<Arc<Op>>> = const { RefCell::new(None) };
}

/// A runnable op in the heap: highest priority first, then lowest sequence number.
struct Runnable {
    priority: Priority,
    seq: u64,
    op: Arc<Op>,
}

impl PartialEq for Runnable {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}

impl Eq for Runnable {}

impl PartialOrd for Runnable {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Runnable {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        self.priority.cmp(&other.priority).then_with(|| other.seq.cmp(&self.seq))
    }
}

struct RunQueue {
    heap: BinaryHeap<Runnable>,
    /// Workers blocked on `work_cv`.
    sleeping: usize,
}

/// Errors ops raised themselves since the last `wait_all`.
struct ErrorLog {
    first: Option<Error>,
    count: usize,
}

/// The state an engine's ops and workers share.
pub(crate) struct Shared {
    queue: Mutex<RunQueue>,
    work_cv: Condvar,
    /// Set once by the owning handle's drop; workers exit when it is set and nothing is left.
    shutdown: AtomicBool,
    /// Ops pushed and not yet finished.
    outstanding: AtomicUsize,
    idle_lock: Mutex<()>,
    idle_cv: Condvar,
    errors: Mutex<ErrorLog>,
    seq: AtomicU64,
    threads: usize,
}

impl Shared {
    pub(crate) fn new(threads: usize) -> Shared {
        Shared {
            queue: Mutex::new(RunQueue { heap: BinaryHeap::new(), sleeping: 0 }),
            work_cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            outstanding: AtomicUsize::new(0),
            idle_lock: Mutex::new(()),
            idle_cv: Condvar::new(),
            errors: Mutex::new(ErrorLog { first: None, count: 0 }),
            seq: AtomicU64::new(0),
            threads,
        }
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    pub(crate) fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }

    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Counts a newly pushed op (before any of its vars can grant it).
    pub(crate) fn op_pushed(&self) {
        self.outstanding.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts a finished op; wakes `wait_all` callers, and idle workers during shutdown.
    pub(crate) fn op_finished(&self) {
        if self.outstanding.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Taking the lock orders this against a waiter between its check and its sleep.
            drop(self.idle_lock.lock());
            self.idle_cv.notify_all();
            if self.shutdown.load(Ordering::SeqCst) {
                drop(self.queue.lock());
                self.work_cv.notify_all();
            }
        }
    }

    pub(crate) fn record_error(&self, err: Error) {
        let mut log = self.errors.lock();
        log.count += 1;
        if log.first.is_none() {
            log.first = Some(err);
        }
    }

    /// Blocks until no op is outstanding, then takes the first logged error.
    pub(crate) fn wait_idle(&self) -> Result<(), Error> {
        if self.outstanding.load(Ordering::SeqCst) != 0 {
            let mut guard = self.idle_lock.lock();
            while self.outstanding.load(Ordering::SeqCst) != 0 {
                self.idle_cv.wait(&mut guard);
            }
        }
        let mut log = self.errors.lock();
        log.count = 0;
        match log.first.take() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// Errors logged since the last `wait_all`.
    pub(crate) fn error_count(&self) -> usize {
        self.errors.lock().count
    }

    /// Asks the workers to exit once every outstanding op has finished.
    pub(crate) fn shut_down(&self) {
        {
            let _queue = self.queue.lock();
            self.shutdown.store(true, Ordering::SeqCst);
        }
        self.work_cv.notify_all();
    }

    /// Whether the calling thread is one of this engine's workers.
    pub(crate) fn is_own_worker(&self) -> bool {
        WORKER_OF.with(|w| w.get()) == self as *const Shared as usize
    }
}

/// Puts a runnable op on its engine's heap. `tail`: the caller is a worker that returns to its
/// run loop next; if it belongs to the op's engine and the heap was empty, no sleeper is woken,
/// because the caller itself will pop the op (saves a futex wake per op in dependency chains).
pub(crate) fn schedule(op: Arc<Op>, tail: bool) {
    let shared = Arc::clone(&op.engine);
    let mut queue = shared.queue.lock();
    let was_empty = queue.heap.is_empty();
    queue.heap.push(Runnable { priority: op.priority, seq: op.seq, op });
    let wake = queue.sleeping > 0 && !(tail && was_empty && shared.is_own_worker());
    drop(queue);
    if wake {
        shared.work_cv.notify_one();
    }
}

/// Whether the calling thread is running `op`'s closure.
pub(crate) fn is_running(op: &Arc<Op>) -> bool {
    RUNNING.try_with(|r| r.borrow().as_ref().is_some_and(|cur| Arc::ptr_eq(cur, op))).unwrap_or(false)
}

/// The op whose closure the calling thread is running, if any (it may have completed already,
/// when it is asynchronous).
pub(crate) fn running_op() -> Option<Arc<Op>> {
    RUNNING.try_with(|r| r.borrow().clone()).ok().flatten()
}

/// Starts worker `index` of `shared`'s pool.
pub(crate) fn spawn_worker(shared: Arc<Shared>, index: usize) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(format!("synkv-engine-{index}"))
        .spawn(move || worker_main(&shared))
        .expect("synkv engine: cannot spawn a pool thread")
}

fn worker_main(shared: &Arc<Shared>) {
    WORKER_OF.with(|w| w.set(Arc::as_ptr(shared) as usize));
    loop {
        let op = {
            let mut queue = shared.queue.lock();
            loop {
                if let Some(runnable) = queue.heap.pop() {
                    break runnable.op;
                }
                if shared.shutdown.load(Ordering::SeqCst) && shared.outstanding.load(Ordering::SeqCst) == 0 {
                    return;
                }
                queue.sleeping += 1;
                shared.work_cv.wait(&mut queue);
                queue.sleeping -= 1;
            }
        };
        run(op);
    }
}

/// Runs one op's closure, catching panics, and finishes it unless it is asynchronous.
fn run(op: Arc<Op>) {
    let Some(work) = op.take_work() else {
        debug_assert!(false, "op `{}` scheduled twice", op.name);
        return;
    };
    RUNNING.with(|r| *r.borrow_mut() = Some(Arc::clone(&op)));
    match work {
        Work::Sync(f) => {
            let own = match panic::catch_unwind(AssertUnwindSafe(f)) {
                Ok(Ok(())) => None,
                Ok(Err(err)) => Some(Error::failed(op.name, err)),
                Err(payload) => Some(Error::panicked(op.name, &*payload)),
            };
            RUNNING.with(|r| *r.borrow_mut() = None);
            op.finish(own, true);
        }
        Work::Async(f) => {
            // The closure itself counts as outstanding until it returns, so `wait_all` also
            // hears of a closure that completes early and then panics.
            op.engine.op_pushed();
            let completion = Completion::new(Arc::clone(&op));
            let panicked =
                panic::catch_unwind(AssertUnwindSafe(move || f(completion))).err().map(|payload| Error::panicked(op.name, &*payload));
            RUNNING.with(|r| *r.borrow_mut() = None);
            if let Some(err) = panicked {
                if !op.finish(Some(err.clone()), true) {
                    // Completed, then panicked: its vars are settled, but the panic must not
                    // vanish.
                    op.engine.record_error(err);
                }
            }
            op.engine.op_finished();
        }
    }
}

//! Engine tests: shared helpers (a watchdog, gates, rendezvous) and one file per area.
//!
//! Every test body runs under [`watchdog`], so a scheduling bug fails the test after
//! [`LIMIT`] instead of hanging the suite; every blocking helper has the same bound.

mod bench;
mod errors;
mod ordering;
mod prop;
mod waits;

use std::panic;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{Completion, Engine, Error, Var};

/// How long any test body, or any blocking helper, may take.
const LIMIT: Duration = Duration::from_secs(10);

/// Runs `body` on its own thread and fails if it has not returned within [`LIMIT`]; a panic in
/// `body` is re-raised here.
fn watchdog<F: FnOnce() + Send + 'static>(body: F) {
    let (tx, rx) = mpsc::channel();
    let handle = thread::Builder::new()
        .name("test-body".into())
        .spawn(move || {
            body();
            let _ = tx.send(());
        })
        .expect("spawn test body");
    match rx.recv_timeout(LIMIT) {
        Ok(()) | Err(RecvTimeoutError::Disconnected) => {
            if let Err(payload) = handle.join() {
                panic::resume_unwind(payload);
            }
        }
        Err(RecvTimeoutError::Timeout) => panic!("test body did not finish within {LIMIT:?}"),
    }
}

/// A latch: closed until [`Gate::open`]; waiting is bounded by [`LIMIT`].
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn open(&self) {
        *self.0 .0.lock() = true;
        self.0 .1.notify_all();
    }

    /// Waits for the gate; false if it stayed closed for [`LIMIT`].
    fn wait(&self) -> bool {
        let deadline = Instant::now() + LIMIT;
        let mut open = self.0 .0.lock();
        while !*open {
            if self.0 .1.wait_until(&mut open, deadline).timed_out() {
                return *open;
            }
        }
        true
    }
}

/// A barrier for `n` parties whose wait gives up after [`LIMIT`].
#[derive(Clone)]
struct Rendezvous(Arc<(Mutex<usize>, Condvar, usize)>);

impl Rendezvous {
    fn new(n: usize) -> Rendezvous {
        Rendezvous(Arc::new((Mutex::new(0), Condvar::new(), n)))
    }

    /// Arrives and waits for the others; false if they did not all arrive within [`LIMIT`].
    fn arrive(&self) -> bool {
        let (count, cv, n) = &*self.0;
        let deadline = Instant::now() + LIMIT;
        let mut arrived = count.lock();
        *arrived += 1;
        cv.notify_all();
        while *arrived < *n {
            if cv.wait_until(&mut arrived, deadline).timed_out() {
                return *arrived >= *n;
            }
        }
        true
    }
}

/// A shared, ordered record of what ops did.
#[derive(Clone)]
struct Log<T>(Arc<Mutex<Vec<T>>>);

impl<T> Default for Log<T> {
    fn default() -> Self {
        Log(Arc::new(Mutex::new(Vec::new())))
    }
}

impl<T: Clone> Log<T> {
    fn push(&self, item: T) {
        self.0.lock().push(item);
    }

    fn snapshot(&self) -> Vec<T> {
        self.0.lock().clone()
    }
}

/// Compile-time check: the public handles can cross threads.
#[allow(dead_code)]
fn assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Engine>();
    check::<Var>();
    check::<Completion>();
    check::<Error>();
}

/// The name of the op an error came from.
fn op_of(err: &Error) -> &'static str {
    match err {
        Error::Failed { op, .. } | Error::Panicked { op, .. } | Error::Dropped { op } => op,
    }
}

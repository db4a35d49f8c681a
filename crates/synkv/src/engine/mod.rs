//! The asynchronous dependency engine (MXNet's "mutation-aware dataflow scheduler").
//!
//! CONTRACT STUB — the bodies are being implemented; the signatures below are the API the rest
//! of the crate codes against. See the implementer's notes in the helper prompt.
#![deny(unsafe_code)]

use std::sync::Arc;

/// Scheduling priority: among ready operations, higher runs first.
pub type Priority = i32;

/// A boxed error an operation may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error an operation raised, returned by the next wait on an affected variable.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operation returned an error.
    #[error("operation `{op}` failed: {source}")]
    Failed {
        /// The operation's name.
        op: &'static str,
        /// What went wrong.
        source: Arc<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The operation panicked; the panic was caught on the pool thread.
    #[error("operation `{op}` panicked: {message}")]
    Panicked {
        /// The operation's name.
        op: &'static str,
        /// The panic payload, when it was a string.
        message: String,
    },
    /// An asynchronous operation dropped its [`Completion`] without completing it.
    #[error("operation `{op}` was dropped before it completed")]
    Dropped {
        /// The operation's name.
        op: &'static str,
    },
}

/// A variable: the unit of dependency tracking (one per array).
#[derive(Clone, Debug)]
pub struct Var(Arc<()>);

impl Var {
    /// A fresh variable with no pending operations.
    pub fn new() -> Var {
        todo!()
    }
}

impl Default for Var {
    fn default() -> Self {
        Var::new()
    }
}

/// Handed to an asynchronous operation; completing it releases the operation's variables.
#[derive(Debug)]
pub struct Completion(());

impl Completion {
    /// The operation succeeded.
    pub fn done(self) {
        todo!()
    }
    /// The operation failed with `err`.
    pub fn fail(self, err: BoxError) {
        let _ = err;
        todo!()
    }
}

/// The engine: a thread pool plus per-variable queues.
#[derive(Clone, Debug)]
pub struct Engine(Arc<()>);

impl Engine {
    /// A new engine with `threads` pool threads (at least 1).
    pub fn new(threads: usize) -> Engine {
        let _ = threads;
        todo!()
    }
    /// The process-wide engine (`SYNKV_ENGINE_THREADS`, default: available parallelism).
    pub fn global() -> &'static Engine {
        todo!()
    }
    /// Schedules a synchronous operation.
    pub fn push<F>(&self, name: &'static str, reads: &[Var], writes: &[Var], priority: Priority, f: F)
    where
        F: FnOnce() -> Result<(), BoxError> + Send + 'static,
    {
        let _ = (name, reads, writes, priority, f);
        todo!()
    }
    /// Schedules an asynchronous operation: it runs on the pool and finishes when `Completion` is used.
    pub fn push_async<F>(&self, name: &'static str, reads: &[Var], writes: &[Var], priority: Priority, f: F)
    where
        F: FnOnce(Completion) + Send + 'static,
    {
        let _ = (name, reads, writes, priority, f);
        todo!()
    }
    /// Waits until every write to `var` pushed before this call has completed; returns (and clears) the var's error.
    pub fn wait_to_read(&self, var: &Var) -> Result<(), Error> {
        let _ = var;
        todo!()
    }
    /// Waits until every read and write of `var` pushed before this call has completed; returns (and clears) the var's error.
    pub fn wait_to_write(&self, var: &Var) -> Result<(), Error> {
        let _ = var;
        todo!()
    }
    /// Waits until every operation pushed before this call has completed; returns (and clears) the first error raised since the last `wait_all`.
    pub fn wait_all(&self) -> Result<(), Error> {
        todo!()
    }
}

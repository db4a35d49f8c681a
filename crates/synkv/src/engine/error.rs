//! The engine's error type: what an op raised, returned by the next wait that observes it.
//!
//! Errors are cheap to clone (the source is an `Arc`), because one failure may be recorded on
//! several written vars and in the engine-wide log at once.

use std::any::Any;
use std::sync::Arc;

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
    /// An asynchronous operation dropped its [`Completion`](super::Completion) without
    /// completing it.
    #[error("operation `{op}` was dropped before it completed")]
    Dropped {
        /// The operation's name.
        op: &'static str,
    },
}

impl Error {
    /// `op` returned or reported `source`.
    pub(crate) fn failed(op: &'static str, source: BoxError) -> Error {
        Error::Failed { op, source: Arc::from(source) }
    }

    /// `op` panicked with `payload` (as caught by `catch_unwind`).
    pub(crate) fn panicked(op: &'static str, payload: &(dyn Any + Send)) -> Error {
        let message = if let Some(s) = payload.downcast_ref::<&'static str>() {
            (*s).to_owned()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "<non-string panic payload>".to_owned()
        };
        Error::Panicked { op, message }
    }
}

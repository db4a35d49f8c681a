//! [`Error`]: the crate-wide error, wrapping each layer's own error type.

use crate::{compression, engine, ndarray, optimizer, ps, store};

/// Any synkv error. Each layer has its own typed error; this enum wraps them so a caller can
/// use `?` across layers and still match on the kind.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An array error (shape, dtype, storage).
    #[error(transparent)]
    NDArray(#[from] ndarray::Error),
    /// A store error (keys, initialisation, unsupported operation).
    #[error(transparent)]
    Store(#[from] store::Error),
    /// A gradient-compression error (parameters, buffer sizes).
    #[error(transparent)]
    Compression(#[from] compression::Error),
    /// An optimizer error (configuration, state file, dtype).
    #[error(transparent)]
    Optimizer(#[from] optimizer::Error),
    /// A distributed-layer error (lost node, timeout, authentication, a server's refusal).
    #[error(transparent)]
    Dist(#[from] ps::Error),
    /// An asynchronous operation failed; returned by the next wait on an affected array.
    #[error(transparent)]
    Engine(#[from] engine::Error),
    /// An error raised by user code, e.g. inside an updater.
    #[error("{0}")]
    Other(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl Error {
    /// Wraps a user error (for example inside an updater closure).
    pub fn other(err: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Error {
        Error::Other(err.into())
    }
}

/// A `Result` whose error is [`synkv::Error`](Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! The optimizer layer's error type.
//!
//! Every message says what was wrong, for which key or parameter, and how to fix it.
//! Lower-level causes (I/O, JSON) are kept as `source` so callers can walk the chain.

use std::path::PathBuf;

use super::ElemType;

/// Errors from building, running, saving or loading an optimizer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A hyper-parameter is out of range (negative learning rate, momentum ≥ 1, …).
    #[error("invalid value {value} for `{param}` of optimizer `{optimizer}`: {reason}")]
    InvalidParameter {
        /// Optimizer name (`"sgd"`, `"adam"`, …).
        optimizer: &'static str,
        /// Parameter name as it appears in the JSON description.
        param: String,
        /// The rejected value, formatted.
        value: String,
        /// Why it is rejected and what to use instead.
        reason: String,
    },

    /// The optimizer description is not valid JSON or does not match the schema.
    #[error(
        "invalid optimizer description: {source}; expected an object such as \
         {{\"name\":\"sgd\",\"momentum\":0.9,\"common\":{{\"learning_rate\":0.1}}}}"
    )]
    Json {
        /// The parser's error (position and cause).
        #[source]
        source: serde_json::Error,
    },

    /// Weight and gradient have different element types.
    #[error(
        "key {key}: gradient is {grad} but the weight is {weight}; push gradients with the \
         weight's dtype"
    )]
    DTypeMismatch {
        /// The key being updated.
        key: String,
        /// Element type of the weight.
        weight: ElemType,
        /// Element type of the gradient.
        grad: ElemType,
    },

    /// Weight and gradient have different numbers of elements.
    #[error(
        "key {key}: gradient has {grad} elements but the weight has {weight}; the gradient must \
         have the weight's shape"
    )]
    LengthMismatch {
        /// The key being updated.
        key: String,
        /// Elements in the weight.
        weight: usize,
        /// Elements in the gradient.
        grad: usize,
    },

    /// A row_sparse gradient does not fit the weight (bad row ids, lengths or row length).
    #[error("key {key}: invalid row_sparse gradient: {reason}")]
    InvalidSparseGradient {
        /// The key being updated.
        key: String,
        /// What is inconsistent.
        reason: String,
    },

    /// The stored optimizer state of a key does not fit the weight or the optimizer.
    #[error("key {key}: optimizer state does not match: {reason}")]
    StateMismatch {
        /// The key whose state is inconsistent.
        key: String,
        /// What differs, and what to do about it.
        reason: String,
    },

    /// A state file written by one optimizer was loaded into another.
    #[error(
        "the optimizer-state file was written by optimizer `{file}` but this updater runs \
         `{current}`; load it into an updater created with `{file}`, or start without states"
    )]
    OptimizerMismatch {
        /// Optimizer recorded in the file.
        file: String,
        /// Optimizer of this updater.
        current: &'static str,
    },

    /// The bytes are not a (complete, intact, supported) synkv optimizer-state file.
    #[error("corrupted or not a synkv optimizer-state file: {reason}")]
    CorruptStateFile {
        /// Which check failed (magic, version, length, checksum, header).
        reason: String,
    },

    /// Reading or writing a state file failed.
    #[error("cannot {action} optimizer states at {}: {source}", path.display())]
    Io {
        /// `"read"` or `"write"`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating-system error.
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with the optimizer [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn invalid(
        optimizer: &'static str,
        param: impl Into<String>,
        value: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        Error::InvalidParameter { optimizer, param: param.into(), value: value.to_string(), reason: reason.into() }
    }

    pub(crate) fn corrupt(reason: impl Into<String>) -> Self {
        Error::CorruptStateFile { reason: reason.into() }
    }

    pub(crate) fn state(key: &str, reason: impl Into<String>) -> Self {
        Error::StateMismatch { key: key.to_owned(), reason: reason.into() }
    }

    pub(crate) fn sparse(key: &str, reason: impl Into<String>) -> Self {
        Error::InvalidSparseGradient { key: key.to_owned(), reason: reason.into() }
    }
}

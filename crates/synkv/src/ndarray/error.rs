//! [`Error`]: what can go wrong with arrays.

use super::{DType, Shape, StorageType};
use crate::engine;

/// An array error: the operation, and both sides of what did not match.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Two arrays that must have one shape do not.
    #[error("{op}: shape mismatch, {lhs} vs {rhs}; both arrays must have the same shape")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// The left (or destination) shape.
        lhs: Shape,
        /// The right (or source) shape.
        rhs: Shape,
    },
    /// Two arrays that must have one dtype do not.
    #[error("{op}: dtype mismatch, {lhs} vs {rhs}; convert one with `as_type` first")]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// The left (or destination) dtype.
        lhs: DType,
        /// The right (or source) dtype.
        rhs: DType,
    },
    /// Data of the wrong length was given for a shape.
    #[error("{op}: {got} elements given for shape {shape} which holds {expected}")]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// The shape.
        shape: Shape,
        /// Elements the shape holds.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// The operation does not support this storage type.
    #[error("{op} does not support {stype} storage{hint}")]
    UnsupportedStorage {
        /// The operation.
        op: &'static str,
        /// The storage type met.
        stype: StorageType,
        /// How to get around it (may be empty).
        hint: &'static str,
    },
    /// Row ids of a row_sparse array are out of range, unsorted or duplicated.
    #[error("{op}: invalid row ids: {reason}")]
    InvalidRowIds {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A pending operation that wrote this array failed.
    #[error(transparent)]
    Engine(#[from] engine::Error),
}

//! [`Error`]: what a store call can reject.

use super::{Key, KeyKind};
use crate::{DType, Shape, StorageType};

/// A store error. Every variant names the operation and the key, says what was wrong and how
/// to fix it. The store is unchanged by a call that returned an error.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `create` got a name it does not know.
    #[error("unknown store type `{name}`; valid types are: {valid}")]
    UnknownStoreType {
        /// The name given.
        name: String,
        /// The accepted names.
        valid: &'static str,
    },
    /// The key was never initialised.
    #[error("{op}: key {key} has not been initialised; call init({key}, value) first")]
    NotInitialized {
        /// The operation.
        op: &'static str,
        /// The key.
        key: Key,
    },
    /// The key was initialised before.
    #[error("duplicate init of key {key}; a key is initialised once (init or broadcast), use push to change its value")]
    DuplicateInit {
        /// The key.
        key: Key,
    },
    /// The store uses one kind of key and the call used the other.
    #[error("{op}: mixed key types are not allowed; this store uses {store} keys, got {got} key {key}")]
    MixedKeyKinds {
        /// The operation.
        op: &'static str,
        /// The kind the store was fixed to by its first call.
        store: KeyKind,
        /// The kind given.
        got: KeyKind,
        /// The offending key.
        key: Key,
    },
    /// A value's shape differs from the key's.
    #[error("{op}: shape mismatch for key {key}: the key holds {expected}, got {got}")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// The key.
        key: Key,
        /// The key's shape.
        expected: Shape,
        /// The shape given.
        got: Shape,
    },
    /// A value's dtype differs from the key's.
    #[error("{op}: dtype mismatch for key {key}: the key holds {expected}, got {got}; convert with as_type({expected}) first")]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// The key.
        key: Key,
        /// The key's dtype.
        expected: DType,
        /// The dtype given.
        got: DType,
    },
    /// The number of keys and of values differ.
    #[error("{op}: {keys} keys but {values} values; give one value (or one list of per-device values) per key")]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// Number of keys.
        keys: usize,
        /// Number of values.
        values: usize,
    },
    /// A key was given an empty list of values.
    #[error("{op}: key {key} was given an empty list of values; give at least one array per key")]
    EmptyValueList {
        /// The operation.
        op: &'static str,
        /// The key.
        key: Key,
    },
    /// A storage type this operation does not accept.
    #[error("{op}: key {key}: {stype} storage is not supported here; {hint}")]
    UnsupportedStorage {
        /// The operation.
        op: &'static str,
        /// The key.
        key: Key,
        /// The storage type met.
        stype: StorageType,
        /// What to do instead.
        hint: &'static str,
    },
    /// The operation is not available for this store type.
    #[error("{op} is not supported by a `{store_type}` store: {reason}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The store's type name.
        store_type: String,
        /// Why, and what to use instead.
        reason: String,
    },
    /// The updater changed the stored value into something of another shape, dtype or storage.
    #[error("updater for key {key} replaced the stored value with {got}, but the key holds {expected}; update the value in place or keep its shape and dtype")]
    UpdaterChangedValue {
        /// The key.
        key: Key,
        /// What the key holds.
        expected: String,
        /// What the updater left.
        got: String,
    },
    /// The row-id arrays do not match the outputs of a row_sparse_pull.
    #[error("row_sparse_pull: {outputs} outputs but {row_ids} row_ids arrays; give one row_ids array per output, or a single one for all outputs of a key")]
    RowIdsMismatch {
        /// Number of outputs.
        outputs: usize,
        /// Number of row-id arrays.
        row_ids: usize,
    },
    /// Row ids that are not integers, or not a dense array.
    #[error("row_sparse_pull: invalid row ids for key {key}: {reason}")]
    InvalidRowIds {
        /// The key.
        key: Key,
        /// What is wrong.
        reason: String,
    },
    /// A row id outside the key's rows.
    #[error("row_sparse_pull: row id {id} is out of range for key {key}, which has {rows} rows")]
    RowIdOutOfRange {
        /// The key.
        key: Key,
        /// The offending id.
        id: i64,
        /// The key's number of rows.
        rows: usize,
    },
    /// The updater returned an error.
    #[error("updater for key {key} failed: {source}")]
    UpdaterFailed {
        /// The key.
        key: Key,
        /// What the updater returned.
        source: std::sync::Arc<crate::Error>,
    },
    /// The updater panicked.
    #[error("updater for key {key} panicked: {message}")]
    UpdaterPanicked {
        /// The key.
        key: Key,
        /// The panic message.
        message: String,
    },
}

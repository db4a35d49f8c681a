//! The one place where synkv errors become Python exceptions.
//!
//! Every exception derives from [`KVStoreError`] (MXNet's `MXNetError`), so `except
//! synkv.KVStoreError` catches them all; the subclasses name the kind:
//!
//! | exception | raised for |
//! | --- | --- |
//! | `KVStoreKeyError` | key never initialised, initialised twice, mixed int/str keys, row id out of range |
//! | `KVStoreShapeError` | a value or output whose shape (or element count) differs from the key's |
//! | `KVStoreDTypeError` | a value whose dtype differs from the key's, or a dtype synkv cannot hold |
//! | `KVStoreUnsupportedError` | an operation, store type or storage type this store does not support |
//! | `UpdaterError` | the updater raised (the Python exception is the `__cause__`) or misbehaved |
//!
//! Errors of asynchronous work (a failed update) travel through the engine and arrive here
//! wrapped; [`to_pyerr`] looks through the wrapping to classify them and to find the original
//! Python exception. Argument errors that Python would raise itself (a key of the wrong type,
//! an output that is not writable) are plain `TypeError` / `ValueError`.

use std::error::Error as StdError;
use std::fmt;

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::{create_exception, PyErr};

create_exception!(synkv, KVStoreError, PyException, "Base class of every error a synkv store raises.");
create_exception!(
    synkv,
    KVStoreKeyError,
    KVStoreError,
    "A key was never initialised, initialised twice, or of the other kind (int vs str)."
);
create_exception!(synkv, KVStoreShapeError, KVStoreError, "A value or output has another shape than the key.");
create_exception!(synkv, KVStoreDTypeError, KVStoreError, "A value has another dtype than the key, or a dtype synkv cannot hold.");
create_exception!(synkv, KVStoreUnsupportedError, KVStoreError, "The operation is not supported by this store type or storage type.");
create_exception!(synkv, UpdaterError, KVStoreError, "The updater raised (see __cause__) or left the stored value unusable.");

/// An exception raised by Python code called from an engine thread (the updater), carried
/// through the engine as a Rust error and re-raised as the `__cause__` of an [`UpdaterError`].
#[derive(Debug)]
pub(crate) struct PythonError {
    message: String,
    err: PyErr,
}

impl PythonError {
    /// Wraps `err`; `py` is needed to render its message once, here.
    pub(crate) fn new(py: Python<'_>, err: PyErr) -> PythonError {
        let kind = err.get_type(py).name().map(|n| n.to_string()).unwrap_or_else(|_| "Exception".into());
        let value = err.value(py).str().map(|s| s.to_string()).unwrap_or_default();
        let message = if value.is_empty() { kind } else { format!("{kind}: {value}") };
        PythonError { message, err }
    }
}

impl fmt::Display for PythonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Python updater raised {}", self.message)
    }
}

impl StdError for PythonError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Base,
    Key,
    Shape,
    DType,
    Unsupported,
    Updater,
}

/// Converts a synkv error into the matching Python exception.
pub(crate) fn to_pyerr(err: synkv::Error) -> PyErr {
    let message = err.to_string();
    let exc = match kind_of(&err) {
        Kind::Base => KVStoreError::new_err(message),
        Kind::Key => KVStoreKeyError::new_err(message),
        Kind::Shape => KVStoreShapeError::new_err(message),
        Kind::DType => KVStoreDTypeError::new_err(message),
        Kind::Unsupported => KVStoreUnsupportedError::new_err(message),
        Kind::Updater => UpdaterError::new_err(message),
    };
    if let Some(cause) = python_cause(&err) {
        Python::attach(|py| exc.set_cause(py, Some(cause.clone_ref(py))));
    }
    exc
}

/// Converts an array-level error (from building or reading an array) into an exception.
pub(crate) fn ndarray_err(err: synkv::ndarray::Error) -> PyErr {
    to_pyerr(err.into())
}

/// The kind of the innermost error that says what went wrong.
fn kind_of(err: &(dyn StdError + 'static)) -> Kind {
    if let Some(e) = err.downcast_ref::<synkv::Error>() {
        return match e {
            synkv::Error::NDArray(e) => kind_of(e),
            synkv::Error::Store(e) => kind_of(e),
            synkv::Error::Engine(e) => kind_of(e),
            synkv::Error::Optimizer(e) => kind_of(e),
            synkv::Error::Other(e) => kind_of(e.as_ref()),
            _ => Kind::Base,
        };
    }
    if let Some(e) = err.downcast_ref::<synkv::optimizer::Error>() {
        use synkv::optimizer::Error as O;
        return match e {
            O::DTypeMismatch { .. } => Kind::DType,
            O::LengthMismatch { .. } => Kind::Shape,
            _ => Kind::Base,
        };
    }
    if let Some(e) = err.downcast_ref::<synkv::store::Error>() {
        use synkv::store::Error as S;
        return match e {
            S::NotInitialized { .. } | S::DuplicateInit { .. } | S::MixedKeyKinds { .. } | S::RowIdOutOfRange { .. } => Kind::Key,
            S::ShapeMismatch { .. } => Kind::Shape,
            S::DTypeMismatch { .. } => Kind::DType,
            S::UnsupportedStorage { .. } | S::Unsupported { .. } => Kind::Unsupported,
            S::UpdaterFailed { .. } | S::UpdaterPanicked { .. } | S::UpdaterChangedValue { .. } => Kind::Updater,
            _ => Kind::Base,
        };
    }
    if let Some(e) = err.downcast_ref::<synkv::ndarray::Error>() {
        use synkv::ndarray::Error as N;
        return match e {
            N::ShapeMismatch { .. } | N::LengthMismatch { .. } => Kind::Shape,
            N::DTypeMismatch { .. } => Kind::DType,
            N::UnsupportedStorage { .. } => Kind::Unsupported,
            N::Engine(e) => kind_of(e),
            _ => Kind::Base,
        };
    }
    if let Some(synkv::engine::Error::Failed { source, .. }) = err.downcast_ref::<synkv::engine::Error>() {
        return kind_of(&**source);
    }
    if err.downcast_ref::<PythonError>().is_some() {
        return Kind::Updater;
    }
    Kind::Base
}

/// The Python exception at the bottom of `err`, if an updater raised one.
fn python_cause<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a PyErr> {
    if let Some(e) = err.downcast_ref::<PythonError>() {
        return Some(&e.err);
    }
    let inner: &'a (dyn StdError + 'static) = if let Some(e) = err.downcast_ref::<synkv::Error>() {
        match e {
            synkv::Error::NDArray(e) => e,
            synkv::Error::Store(e) => e,
            synkv::Error::Engine(e) => e,
            synkv::Error::Optimizer(e) => e,
            synkv::Error::Other(e) => e.as_ref(),
            _ => return None,
        }
    } else if let Some(synkv::store::Error::UpdaterFailed { source, .. }) = err.downcast_ref::<synkv::store::Error>() {
        &**source
    } else if let Some(synkv::ndarray::Error::Engine(e)) = err.downcast_ref::<synkv::ndarray::Error>() {
        e
    } else if let Some(synkv::engine::Error::Failed { source, .. }) = err.downcast_ref::<synkv::engine::Error>() {
        &**source
    } else {
        return None;
    };
    python_cause(inner)
}

/// Registers the exception classes on the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("KVStoreError", py.get_type::<KVStoreError>())?;
    m.add("KVStoreKeyError", py.get_type::<KVStoreKeyError>())?;
    m.add("KVStoreShapeError", py.get_type::<KVStoreShapeError>())?;
    m.add("KVStoreDTypeError", py.get_type::<KVStoreDTypeError>())?;
    m.add("KVStoreUnsupportedError", py.get_type::<KVStoreUnsupportedError>())?;
    m.add("UpdaterError", py.get_type::<UpdaterError>())?;
    Ok(())
}

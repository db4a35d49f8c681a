//! Translating Python call arguments: keys, and the one / list / list-of-lists shape of values
//! and outputs (spec K3.1). The flattening rules themselves are the core's; this file only
//! mirrors the Python structure into [`Keys`] and [`Arrays`].

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyString, PyTuple};
use synkv::store::{Arrays, Keys};
use synkv::{Key, NDArray};

use crate::arrays::is_array_like;

/// The shape of a values / outputs argument, as indices into the call's borrowed arrays.
#[derive(Debug)]
pub(crate) enum Layout {
    /// One array.
    One(usize),
    /// A list of arrays.
    List(Vec<usize>),
    /// A list of lists of arrays (an array in such a list counts as a one-element list).
    Nested(Vec<Vec<usize>>),
}

impl Layout {
    /// The core's view of this argument over the call's arrays.
    pub(crate) fn arrays<'a>(&self, all: &'a [NDArray]) -> Arrays<'a> {
        match self {
            Layout::One(i) => Arrays::One(&all[*i]),
            Layout::List(v) => Arrays::List(v.iter().map(|&i| &all[i]).collect()),
            Layout::Nested(vv) => Arrays::Nested(vv.iter().map(|v| v.iter().map(|&i| &all[i]).collect()).collect()),
        }
    }
}

/// One key: an `int` (32-bit, `bool` included as in MXNet) or a `str`.
pub(crate) fn key(obj: &Bound<'_, PyAny>) -> PyResult<Key> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Key::Str(s.to_cow()?.into_owned()));
    }
    if obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyBool>() {
        return obj
            .extract::<i32>()
            .map(Key::Int)
            .map_err(|_| PyOverflowError::new_err(format!("int key {obj} does not fit in 32 bits (keys are C ints, as in MXNet)")));
    }
    Err(PyTypeError::new_err(format!("unexpected type for keys: {} (keys are int or str)", obj.get_type().name()?)))
}

/// A key or a list / tuple of keys.
pub(crate) fn keys(obj: &Bound<'_, PyAny>) -> PyResult<Keys> {
    if is_array_like(obj) {
        return Ok(Keys::One(key(obj)?));
    }
    obj.try_iter()?.map(|k| key(&k?)).collect::<PyResult<Vec<Key>>>().map(Keys::Many)
}

/// The layout of a values / outputs argument; `leaf` borrows one array and says where it went.
/// An element counts as one array when `is_leaf` says so, else as a list.
pub(crate) fn layout<'py>(
    obj: &Bound<'py, PyAny>,
    is_leaf: impl Fn(&Bound<'py, PyAny>) -> bool,
    mut leaf: impl FnMut(&Bound<'py, PyAny>) -> PyResult<usize>,
) -> PyResult<Layout> {
    if is_leaf(obj) {
        return Ok(Layout::One(leaf(obj)?));
    }
    let items: Vec<Bound<'py, PyAny>> = obj.try_iter()?.collect::<PyResult<_>>()?;
    if items.iter().all(&is_leaf) {
        return items.iter().map(&mut leaf).collect::<PyResult<_>>().map(Layout::List);
    }
    let mut nested = Vec::with_capacity(items.len());
    for item in &items {
        if is_leaf(item) {
            nested.push(vec![leaf(item)?]);
        } else {
            let inner: Vec<Bound<'py, PyAny>> = item.try_iter()?.collect::<PyResult<_>>()?;
            nested.push(inner.iter().map(&mut leaf).collect::<PyResult<_>>()?);
        }
    }
    Ok(Layout::Nested(nested))
}

/// Whether `obj` is one row-id array: an array, or a list / tuple of ints (possibly empty).
pub(crate) fn is_row_ids(obj: &Bound<'_, PyAny>) -> bool {
    if is_array_like(obj) {
        return true;
    }
    let ints = |it: Bound<'_, PyAny>| it.is_instance_of::<PyInt>();
    match (obj.cast::<PyList>(), obj.cast::<PyTuple>()) {
        (Ok(l), _) => l.iter().all(ints),
        (_, Ok(t)) => t.iter().all(ints),
        _ => false,
    }
}

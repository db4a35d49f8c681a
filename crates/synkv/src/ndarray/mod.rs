//! N-dimensional arrays: the values a store keeps and moves.
//!
//! An [`NDArray`] is a cheap handle (`Arc`) over a shape, a [`DType`], a [`Context`] (the
//! device it lives on), a [`StorageType`] and the data itself. Every array owns an engine
//! [`Var`](crate::engine::Var): store operations that read or write the array are scheduled on
//! the dependency engine against that var, so they run asynchronously but in order. The
//! synchronous methods here ([`NDArray::to_vec`], arithmetic, …) first wait for the pending
//! operations that touch the array, then compute on the calling thread.
//!
//! What this module deliberately does not do: broadcasting arithmetic, views with strides, or
//! device memory. A CUDA device can be added as a new [`DeviceType`] variant later: every
//! allocation goes through [`Context`].
//!
//! Layout:
//! - `dtype.rs` — [`DType`] and its parse error;
//! - `shape.rs` — [`Shape`];
//! - `context.rs` — [`Context`], [`DeviceType`];
//! - `data.rs` — [`Data`], owned or external (zero-copy) elements (`unsafe`);
//! - `lend.rs` — a dense array's bytes lent to the network as `Bytes`, no copy (`unsafe`);
//! - `buffer.rs` — [`Buffer`], a typed, contiguous vector of one dtype;
//! - `storage.rs` — [`Storage`] (dense | row_sparse) and [`StorageType`];
//! - `array.rs` — [`NDArray`] itself (construction, access, waiting, copies);
//! - `ops.rs` — elementwise arithmetic with scalars and arrays;
//! - `sparse.rs` — row_sparse kernels (sum by row union, gather rows by id);
//! - `error.rs` — [`Error`].
#![deny(unsafe_code)] // except in data.rs (item by item) and lend.rs

mod array;
mod buffer;
mod context;
mod data;
mod dtype;
mod error;
mod lend;
mod ops;
mod shape;
pub mod sparse;
mod storage;

pub use array::NDArray;
pub use buffer::{Buffer, BufferElement};
pub use context::{Context, DeviceType};
pub use data::Data;
pub use dtype::{DType, ParseDTypeError};
pub use error::Error;
pub use shape::Shape;
pub use storage::{RowSparse, Storage, StorageType};

pub(crate) use lend::{lend_bytes, loan_ranges};

/// A `Result` whose error is an [`ndarray::Error`](Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! Optimizers: what a store runs on a merged gradient after `set_optimizer` (spec K6).
//!
//! # Brief overview
//!
//! * [`Optimizer`] — an optimizer as **data**: a serialisable description (name plus
//!   hyper-parameters) that a local store turns into an updater and that the distributed
//!   store sends to its servers. One struct per algorithm ([`Sgd`], [`Nag`], [`Signum`],
//!   [`Adam`], [`AdamW`], [`Lamb`], [`AdaGrad`], [`RmsProp`], [`AdaDelta`], [`Ftrl`],
//!   [`TestOptimizer`]) plus the shared [`Common`] block (learning rate, weight decay,
//!   gradient rescaling and clipping, per-key multipliers, `begin_num_update`,
//!   multi-precision, [`LrScheduler`]). Defaults are MXNet 1.9.1's.
//! * [`Updater`] — runs an optimizer: per-key states created lazily, per-key update
//!   counts, the scheduler, multi-precision master copies, dense and row_sparse gradients,
//!   and saving/loading the states ([`mod@format`] documents the file).
//! * [`WeightMut`] / [`GradRef`] — the weight and gradient slices the store lends it, in
//!   f32, f64, f16 or bf16.
//! * [`OptimizerState`] — one key's state, readable for inspection.
//!
//! The arithmetic is MXNet 1.9.1's, operation for operation, so float32 results match
//! MXNet's to the last bit or nearly (tests compare several steps of every optimizer with
//! numbers produced by MXNet, within 1e-6 relative). Each optimizer is one fused pass over
//! weight, gradient and states; arrays above [`PAR_MIN_LEN`] elements are split across the
//! rayon pool.
//!
//! # Precision
//!
//! f32 weights compute in f32 (hyper-parameters rounded to f32, as MXNet's kernels do);
//! f64 weights compute in f64 with full-precision hyper-parameters. f16/bf16 weights with
//! `multi_precision` keep an f32 master copy in the state, update it in f32 and round the
//! result into the weight (MXNet's behaviour for f16, extended to bf16). Without
//! `multi_precision` they are still computed in f32 per element and rounded once into
//! the weight, with f32 states — more precise than MXNet, which rounds to f16 after every
//! operation and keeps f16 states.
//!
//! # What this module does not do
//!
//! It knows no store, engine, array or network type: it works on slices, and the store
//! decides which key is updated when. It does not log, and it never panics on user input.
//!
//! # Example
//!
//! ```
//! use synkv::optimizer::{Optimizer, Sgd, Updater, WeightMut, GradRef};
//!
//! let opt = Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() })
//!     .with_learning_rate(0.1)
//!     .with_wd(1e-4);
//! let mut updater = Updater::try_new(opt)?;
//! let mut weight = vec![1.0f32; 4];
//! let grad = vec![0.5f32; 4];
//! updater.update("3", WeightMut::F32(&mut weight), GradRef::F32(&grad))?;
//! assert!(weight[0] < 1.0);
//!
//! // States survive a save/load round trip.
//! let bytes = updater.save_states();
//! let mut resumed = Updater::from_saved_states(&bytes)?;
//! assert_eq!(resumed.update_count("3"), Some(1));
//! # resumed.update("3", WeightMut::F32(&mut weight), GradRef::F32(&grad))?;
//! # Ok::<(), synkv::optimizer::Error>(())
//! ```

#![deny(unsafe_code)]

mod adagrad;
mod adam;
mod config;
mod error;
pub mod format;
mod ftrl;
mod kernel;
mod params;
mod rmsprop;
mod scheduler;
mod sgd;
mod shard;
mod sparse;
mod state;
mod tensor;
mod updater;

#[cfg(test)]
#[rustfmt::skip]
mod oracle_cases;
#[cfg(test)]
mod oracle_tests;
#[cfg(test)]
mod tests;

pub use config::{Common, Optimizer};
pub use error::{Error, Result};
pub use kernel::PAR_MIN_LEN;
pub use params::{AdaDelta, AdaGrad, Adam, AdamW, Ftrl, Lamb, Nag, RmsProp, Sgd, Signum, TestOptimizer};
pub use scheduler::{LrScheduler, Schedule, Warmup, WarmupMode};
pub use state::{OptimizerState, MASTER_SLOT};
pub use tensor::{ElemType, GradRef, WeightMut};
pub use updater::{LentUpdate, Updater};

//! The asynchronous dependency engine (MXNet's "mutation-aware dataflow scheduler").
//!
//! Every operation declares the [`Var`]s it reads and the ones it writes, and a [`Priority`].
//! The engine runs it on a pool of threads once its dependencies allow:
//!
//! - ops on disjoint vars run concurrently;
//! - ops on the same var run in submission order: consecutive reads may overlap, a write waits
//!   for every earlier read and write of the var, a read waits for every earlier write
//!   (RAW, WAR, WAW);
//! - among ready ops the highest priority runs first, FIFO among equals;
//! - an op with no vars is ready at once.
//!
//! A var listed both as read and as write counts as a write for ordering (duplicates within a
//! list are ignored). Asynchronous ops ([`Engine::push_async`]) receive a [`Completion`] and
//! finish when it is used, possibly later and from any thread; a dropped `Completion` finishes
//! the op with [`Error::Dropped`], so nothing hangs on a forgotten completion. A lending op
//! ([`Engine::push_async_lending`]) also receives a [`ReadLease`]: its read-only vars are
//! released when the lease is dropped, before or after the op completes.
//!
//! ## Errors
//! An op fails when its closure returns `Err`, panics (caught; the pool thread survives) or
//! drops its completion. When an op finishes, its outcome is its own error if any, else the
//! first error recorded on one of its read vars (in the order of `reads`; a var that is read and
//! written counts), else `Ok`. Every var it writes then records that outcome: an error
//! propagates down the dataflow, and a later successful write clears it. No op is ever skipped.
//! [`Engine::wait_to_read`] / [`Engine::wait_to_write`] return and clear a var's recorded error;
//! [`Engine::begin_wait_to_write`] starts the same wait as `wait_to_write` without blocking
//! (a [`PendingWait`] to poll or finish later; front-ends build non-blocking calls on it).
//! [`Engine::wait_all`] returns and clears the first error (in completion order) that an op raised
//! itself since the previous `wait_all`; errors merely propagated from a read var are not logged
//! again.
//!
//! ## Waiting from inside an op
//! A wait whose target has already completed returns at once, even on a pool thread. Waiting for
//! something that needs the op you are in to finish first is a deadlock: the engine detects the
//! certain cases (an unfinished op waiting to read a var it writes or to write a var it uses,
//! or an op's closure calling `wait_all` on its own engine) and panics, which fails that op
//! instead of hanging. Waiting on an op queued behind your own (through other vars) cannot be
//! detected and is a user error, as is blocking every pool thread on work that needs one.
//!
//! ## Organisation
//! - `var` — [`Var`]: a small mutex-protected queue per var; grants reads and writes.
//! - `op` — one pushed operation (pending-dependency counter, closure, inherited error) and
//!   [`Completion`].
//! - `pool` — the ready queue (a priority heap) and the worker threads.
//! - `scheduler` — [`Engine`]: the public handle, `push`, waits, the global engine.
//!
//! There is no global lock held while ops run. Pushing an op costs O(#vars) short critical
//! sections; ops with two or more vars additionally take one process-wide lock while they
//! enqueue, so that concurrent pushes from several threads cannot order two vars' queues
//! inconsistently (which would deadlock).
//!
//! ## Example
//! ```
//! # use synkv::engine::{Engine, Var};
//! let engine = Engine::new(2);
//! let (a, b) = (Var::new(), Var::new());
//! engine.push("init-a", &[], &[a.clone()], 0, || Ok(()));
//! engine.push("b=f(a)", &[a.clone()], &[b.clone()], 0, || Err("bad input".into()));
//! assert!(engine.wait_to_read(&b).is_err()); // the failure is reported on the var it wrote
//! assert!(engine.wait_all().is_err()); // and once, engine-wide
//! assert!(engine.wait_all().is_ok());
//! ```
#![deny(unsafe_code)]

mod error;
mod op;
mod pool;
mod scheduler;
mod var;

#[cfg(test)]
mod tests;

pub use error::{BoxError, Error};
pub use op::{Completion, Priority, ReadLease};
pub use scheduler::{Engine, PendingWait};
pub use var::Var;

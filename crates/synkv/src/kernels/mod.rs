//! Kernels: vectorised, parallel loops over slices — the store's arithmetic.
//!
//! A store sums the K per-device gradients of a push into its value ([`sum_into`], which
//! assigns: no zeroing pass), adds ([`add_into`]), copies the value out to pulls ([`copy`]),
//! and applies simple updates ([`axpy`], [`scale`], [`fill`]); [`cast()`] converts between
//! element types. These are the only place in synkv where performance tricks live; the
//! functions are pure (slices in, slices out) and know nothing of arrays, engines or stores.
//!
//! # Speed
//! - **SIMD, chosen at run time.** One binary runs everywhere: the best instruction set the
//!   CPU has ([`Isa::Avx512`], [`Isa::Avx2`], else portable code) is detected once and cached;
//!   a call costs a few relaxed atomic loads on top of its loop. No allocation, ever.
//! - **Threads for large arrays.** From [`Tuning::parallel_min_len`] elements the destination
//!   is split into page-sized pieces run on the current rayon pool (the global one unless the
//!   caller is inside `ThreadPool::install`); below it the calling thread does everything.
//! - **Streaming stores for large destinations.** A destination that is written without being
//!   read (`sum_into`, `copy`, `fill`, and same-type `cast`) and is at least
//!   [`Tuning::stream_min_bytes`] long is written with non-temporal stores, which skip the
//!   read-for-ownership (a normal store reads the line first, doubling write traffic) and do
//!   not evict the sources. The stores are fenced (`sfence`) before a call returns.
//!
//! **Alignment:** none required. Sources are read with unaligned loads; a destination's
//! partial cache lines at either end use normal stores and the rest streams, so a
//! 64-byte-aligned destination streams every line (a large `Vec` from the system allocator is
//! usually 16 bytes past a line: 48 bytes go the normal way).
//!
//! # Results
//! Every path — each ISA level, threaded or not, streaming or not — gives the same bits as
//! the portable reference, so results do not depend on the machine or the thread count:
//!
//! | type | `sum_into` / `add_into` | `axpy` (`d + a·x`) / `scale` (`d·a`) |
//! |------|-------------------------|--------------------------------------|
//! | `f32`, `f64` | `((s0 + s1) + s2) + …` in the type, left to right | `a` rounded to the type once; multiply then add, never fused |
//! | `f16`, `bf16` | widened to f32, summed as above, rounded once (nearest even) | in f32 as for `f32`, rounded once |
//! | `i32`, `i64` | wrapping integer addition | in f64, then `from_f64` (nearest, saturating); `i64` beyond 2^53 loses precision |
//! | other `Element` impls | in f64, rounded once by `from_f64` | in f64 |
//!
//! `cast::<T, U>` means `U::from_f64(x.to_f64())` (a bit copy when `T == U`).
//!
//! Lengths follow the original contract: `add_into`, `axpy` and `cast` work on the common
//! prefix of their slices (like `zip`); `sum_into` needs every source to be at least as long as
//! the destination; `copy` needs equal lengths. The last two panic otherwise.
//!
//! # Example
//! ```
//! use synkv::kernels::{copy, sum_into};
//!
//! let grads = [vec![1.0f32; 1000], vec![2.0f32; 1000]];
//! let mut stored = vec![0.0f32; 1000];
//! sum_into(&mut stored, &[&grads[0], &grads[1]]);
//! let mut out = vec![0.0f32; 1000];
//! copy(&mut out, &stored);
//! assert!(out.iter().all(|&x| x == 3.0));
//! ```
//!
//! # Organisation
//! `element` (the [`Element`] trait), `tuning` ([`Isa`], [`Tuning`]), `ops` and `cast` (typed
//! dispatch), `parallel` (rayon splitting), `reduced` (f16/bf16 through f32), `scalar` (the
//! portable reference) and `simd` (the only unsafe code: a safe dispatching `mod.rs`, then
//! `avx2.rs` and `avx512.rs`, compiled on x86-64 only). Tests live in `tests/`.
#![deny(unsafe_code)]

mod cast;
mod element;
mod ops;
mod parallel;
mod reduced;
mod scalar;
// AVX-512 needs Rust 1.89 (see the module doc): tell Clippy until the workspace MSRV is raised.
mod simd;
#[cfg(test)]
mod tests;
mod tuning;

pub use element::Element;
#[doc(hidden)]
pub use element::{View, ViewList, ViewMut};
pub use tuning::{set_tuning, tuning, Isa, Tuning};

use tuning::Plan;

/// `dst = Σ srcs` (assign), element `i` being `srcs[0][i] + srcs[1][i] + …` left to right.
/// Each source normally has `dst.len()` elements (longer ones are read only that far); with
/// no sources `dst` is zeroed.
///
/// # Panics
/// If a source is shorter than `dst`.
pub fn sum_into<T: Element>(dst: &mut [T], srcs: &[&[T]]) {
    for s in srcs {
        assert!(s.len() >= dst.len(), "kernels::sum_into: a source has {} elements but the destination has {}", s.len(), dst.len());
    }
    ops::sum_into(&Plan::current(), dst, srcs);
}

/// `dst += src`, over the first `min(dst.len(), src.len())` elements (like `zip`).
pub fn add_into<T: Element>(dst: &mut [T], src: &[T]) {
    let n = dst.len().min(src.len());
    ops::add_into(&Plan::current(), &mut dst[..n], &src[..n]);
}

/// `dst = src`.
///
/// # Panics
/// If the lengths differ (as `copy_from_slice` does).
pub fn copy<T: Element>(dst: &mut [T], src: &[T]) {
    assert!(dst.len() == src.len(), "kernels::copy: the source has {} elements but the destination has {}", src.len(), dst.len());
    ops::copy(&Plan::current(), dst, src);
}

/// `dst = src` for the bytes of array elements (an answer written into a loaned output of
/// `whole` bytes, of which `dst` is one part), planned as [`copy`] plans the elements — except
/// that the part streams from [`MESSAGE_STREAM_MIN_BYTES`] when the whole output is large
/// enough to stream: its parts, written one after another, cannot stay in the cache anyway
/// (16M f32 answered in 1 MiB parts otherwise spent a fifth of its time in cached copies).
///
/// # Panics
/// If the lengths differ.
pub fn copy_element_bytes(dst: &mut [u8], src: &[u8], whole: usize) {
    assert!(
        dst.len() == src.len(),
        "kernels::copy_element_bytes: the source has {} bytes but the destination has {}",
        src.len(),
        dst.len()
    );
    let p = Plan::current();
    let plan = if p.stream(whole) { Plan::with(p.isa, p.parallel_min_len, p.stream_min_bytes.min(MESSAGE_STREAM_MIN_BYTES)) } else { p };
    ops::copy_pod(&plan, dst, src);
}

/// Message data this large or larger is copied with streaming stores by [`copy_bytes`].
const MESSAGE_STREAM_MIN_BYTES: usize = 256 << 10;

/// `dst = src` for raw bytes (message data into shared memory, a reused send buffer), on
/// the calling thread (no kernel pool: message copies run beside the user's own compute,
/// which the pool's threads would compete with): non-temporal stores from
/// [`MESSAGE_STREAM_MIN_BYTES`] on, below the general kernels' threshold, because the bytes
/// are read next by the network or another process, not by the caller, so caching them
/// only evicts what the caller works on.
///
/// # Panics
/// If the lengths differ.
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert!(dst.len() == src.len(), "kernels::copy_bytes: the source has {} bytes but the destination has {}", src.len(), dst.len());
    let p = Plan::current();
    let plan = Plan::with(p.isa, usize::MAX, p.stream_min_bytes.min(MESSAGE_STREAM_MIN_BYTES));
    ops::copy_pod(&plan, dst, src);
}

/// `dst += a * x` (multiply, then add: two roundings, no fused multiply-add), over the first
/// `min(dst.len(), x.len())` elements.
pub fn axpy<T: Element>(dst: &mut [T], a: f64, x: &[T]) {
    let n = dst.len().min(x.len());
    ops::axpy(&Plan::current(), &mut dst[..n], a, &x[..n]);
}

/// `dst *= a`.
pub fn scale<T: Element>(dst: &mut [T], a: f64) {
    ops::scale(&Plan::current(), dst, a);
}

/// `dst[i] = v` for every element.
pub fn fill<T: Element>(dst: &mut [T], v: T) {
    ops::fill(&Plan::current(), dst, v);
}

/// `dst[i] = U::from_f64(src[i].to_f64())`, converting between element types (a bit copy
/// when `T` and `U` are the same built-in type), over the first `min(dst.len(), src.len())`
/// elements. f32 ↔ f16/bf16 use vector conversions.
pub fn cast<T: Element, U: Element>(dst: &mut [U], src: &[T]) {
    let n = dst.len().min(src.len());
    cast::cast(&Plan::current(), &mut dst[..n], &src[..n]);
}

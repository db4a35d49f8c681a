//! The SIMD layer: safe, ISA-dispatching entry points over the unsafe per-ISA files.
//!
//! Each function here takes the [`Isa`] the caller's plan allows and runs the best
//! implementation that both the plan and the CPU permit: `avx512.rs`, `avx2.rs`, or the portable
//! body in `scalar.rs`. The CPU check is repeated on every call (one relaxed atomic load of the
//! cached detection), so no caller can reach an instruction the CPU lacks; that check is the
//! whole safety argument for calling the `#[target_feature]` functions.
//!
//! Every ISA function has one precondition only — the CPU supports its features — and checks
//! slice lengths itself. The element-wise loops are the `scalar.rs` bodies recompiled under
//! `#[target_feature]` (the compiler vectorises them with the wider registers); the sums, the
//! f16 conversions and the streaming (non-temporal) copies and fills are written by hand.
//!
//! Streaming functions end with `sfence`, so their stores are ordered before anything the
//! thread does next (e.g. signalling rayon that the chunk is done).
//!
//! On targets other than x86-64 only the portable bodies exist; nothing here is `cfg`-gated
//! for callers.
//!
//! **MSRV:** the AVX-512 intrinsics and `#[target_feature(enable = "avx512f")]` are stable
//! since Rust 1.89, so the crate needs at least 1.89. The `#[clippy::msrv]` on `mod simd;`
//! says so to Clippy until the workspace's `rust-version` is raised (then it can go).
#![allow(unsafe_code)]

use half::{bf16, f16};

use super::scalar;
use super::Isa;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Plain-old-data element types: no padding, every bit pattern valid, and a size that divides
/// 64, so any run of whole elements can be copied or filled as raw bytes and a 64-byte line
/// that starts on an element boundary holds whole elements.
///
/// # Safety
/// Implementors must satisfy every property above.
pub(crate) unsafe trait Pod: Copy + Send + Sync + 'static {}
// SAFETY: primitive numbers: no padding, all bit patterns valid, size 4 or 8.
unsafe impl Pod for f32 {}
// SAFETY: as above.
unsafe impl Pod for f64 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above.
unsafe impl Pod for i64 {}
// SAFETY: bytes: size 1, no padding, all bit patterns valid (raw message data).
unsafe impl Pod for u8 {}
// SAFETY: `f16` is `#[repr(transparent)]` over `u16`: size 2, all bit patterns valid.
unsafe impl Pod for f16 {}
// SAFETY: `bf16` is `#[repr(transparent)]` over `u16`: size 2, all bit patterns valid.
unsafe impl Pod for bf16 {}

/// The best level this CPU runs, detected on first use and cached (0 = not yet known).
pub(crate) fn best_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::atomic::{AtomicU8, Ordering};
        static BEST: AtomicU8 = AtomicU8::new(0);
        match BEST.load(Ordering::Relaxed) {
            1 => Isa::Scalar,
            2 => Isa::Avx2,
            3 => Isa::Avx512,
            _ => {
                let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c");
                let isa = if avx2 && is_x86_feature_detected!("avx512f") {
                    Isa::Avx512
                } else if avx2 {
                    Isa::Avx2
                } else {
                    Isa::Scalar
                };
                BEST.store(isa as u8 + 1, Ordering::Relaxed);
                isa
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    Isa::Scalar
}

/// Generates safe dispatchers: `fn name(isa, args…)` runs `avx512::name(args…)` or
/// `avx2::name(args…)` when the plan and the CPU allow, else the given portable expression.
macro_rules! dispatch {
    ($($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),*) => $fallback:expr;)*) => {$(
        $(#[$m])*
        #[inline]
        pub(crate) fn $name(isa: Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                let best = best_isa();
                if isa >= Isa::Avx512 && best >= Isa::Avx512 {
                    // SAFETY: the CPU supports AVX-512F, AVX2 and F16C (`best_isa` checked).
                    return unsafe { avx512::$name($($arg),*) };
                }
                if isa >= Isa::Avx2 && best >= Isa::Avx2 {
                    // SAFETY: the CPU supports AVX2 and F16C (`best_isa` checked).
                    return unsafe { avx2::$name($($arg),*) };
                }
            }
            let _ = isa;
            $fallback
        }
    )*};
}

/// Generates, in an ISA file, `#[target_feature]` copies of portable `scalar.rs` bodies.
/// Invoked as `instantiate!("avx2,f16c", "AVX2 and F16C"; fn name(args…); …)`.
#[cfg(target_arch = "x86_64")]
macro_rules! instantiate {
    ($features:literal, $what:literal; $(fn $name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[doc = concat!("`scalar::", stringify!($name), "` compiled for ", $what, ".")]
        ///
        /// # Safety
        #[doc = concat!("The CPU must support ", $what, ".")]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name($($arg: $ty),*) {
            crate::kernels::scalar::$name($($arg),*)
        }
    )*};
}
#[cfg(target_arch = "x86_64")]
use instantiate;

dispatch! {
    /// `dst[i] = Σ_k srcs[k][off + i]`, left to right; streams the stores if `stream`.
    fn sum_f32(dst: &mut [f32], srcs: &[&[f32]], off: usize, stream: bool) => {
        let _ = stream; // the portable path never streams
        scalar::sum_f32(dst, srcs, off)
    };
    /// `dst[i] = Σ_k srcs[k][off + i]`, left to right; streams the stores if `stream`.
    fn sum_f64(dst: &mut [f64], srcs: &[&[f64]], off: usize, stream: bool) => {
        let _ = stream; // the portable path never streams
        scalar::sum_f64(dst, srcs, off)
    };
    /// Wrapping `dst[i] = Σ_k srcs[k][off + i]`.
    fn sum_i32(dst: &mut [i32], srcs: &[&[i32]], off: usize) => scalar::sum_i32(dst, srcs, off);
    /// Wrapping `dst[i] = Σ_k srcs[k][off + i]`.
    fn sum_i64(dst: &mut [i64], srcs: &[&[i64]], off: usize) => scalar::sum_i64(dst, srcs, off);
    /// `dst += src`.
    fn add_f32(dst: &mut [f32], src: &[f32]) => scalar::add_f32(dst, src);
    /// `dst += src`.
    fn add_f64(dst: &mut [f64], src: &[f64]) => scalar::add_f64(dst, src);
    /// `dst += src`, wrapping.
    fn add_i32(dst: &mut [i32], src: &[i32]) => scalar::add_i32(dst, src);
    /// `dst += src`, wrapping.
    fn add_i64(dst: &mut [i64], src: &[i64]) => scalar::add_i64(dst, src);
    /// `dst = dst + a * x`, two roundings.
    fn axpy_f32(dst: &mut [f32], a: f32, x: &[f32]) => scalar::axpy_f32(dst, a, x);
    /// `dst = dst + a * x`, two roundings.
    fn axpy_f64(dst: &mut [f64], a: f64, x: &[f64]) => scalar::axpy_f64(dst, a, x);
    /// `dst = round(dst + a * x)` in f64.
    fn axpy_i32(dst: &mut [i32], a: f64, x: &[i32]) => scalar::axpy_i32(dst, a, x);
    /// `dst = round(dst + a * x)` in f64.
    fn axpy_i64(dst: &mut [i64], a: f64, x: &[i64]) => scalar::axpy_i64(dst, a, x);
    /// `dst *= a`.
    fn scale_f32(dst: &mut [f32], a: f32) => scalar::scale_f32(dst, a);
    /// `dst *= a`.
    fn scale_f64(dst: &mut [f64], a: f64) => scalar::scale_f64(dst, a);
    /// `dst = round(dst * a)` in f64.
    fn scale_i32(dst: &mut [i32], a: f64) => scalar::scale_i32(dst, a);
    /// `dst = round(dst * a)` in f64.
    fn scale_i64(dst: &mut [i64], a: f64) => scalar::scale_i64(dst, a);
    /// f16 → f32 for `dst.len()` elements.
    fn f16_to_f32(dst: &mut [f32], src: &[f16]) => scalar::f16_to_f32(dst, src);
    /// f32 → f16 (round to nearest even) for `dst.len()` elements.
    fn f32_to_f16(dst: &mut [f16], src: &[f32]) => scalar::f32_to_f16(dst, src);
    /// bf16 → f32 for `dst.len()` elements.
    fn bf16_to_f32(dst: &mut [f32], src: &[bf16]) => scalar::bf16_to_f32(dst, src);
    /// f32 → bf16 (round to nearest even) for `dst.len()` elements.
    fn f32_to_bf16(dst: &mut [bf16], src: &[f32]) => scalar::f32_to_bf16(dst, src);
}

/// Copies `src` into `dst` (equal lengths) with non-temporal stores where the plan allows,
/// without the closing fence: call [`fence`] before the data is handed to another thread.
/// Falls back to an ordinary copy at [`Isa::Scalar`].
#[inline]
pub(crate) fn copy_stream_unfenced<T: Pod>(isa: Isa, dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "copy: length mismatch");
    #[cfg(target_arch = "x86_64")]
    {
        let best = best_isa();
        if isa >= Isa::Avx512 && best >= Isa::Avx512 {
            // SAFETY: the CPU supports AVX-512F (checked just above).
            return unsafe { avx512::copy_stream(dst, src) };
        }
        if isa >= Isa::Avx2 && best >= Isa::Avx2 {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { avx2::copy_stream(dst, src) };
        }
    }
    let _ = isa;
    dst.copy_from_slice(src);
}

/// Fills `dst` with `v` using non-temporal stores where the plan allows, without the closing
/// fence (see [`fence`]). Falls back to `slice::fill` at [`Isa::Scalar`].
#[inline]
pub(crate) fn fill_stream_unfenced<T: Pod>(isa: Isa, dst: &mut [T], v: T) {
    #[cfg(target_arch = "x86_64")]
    {
        let best = best_isa();
        if isa >= Isa::Avx512 && best >= Isa::Avx512 {
            // SAFETY: the CPU supports AVX-512F (checked just above).
            return unsafe { avx512::fill_stream(dst, v) };
        }
        if isa >= Isa::Avx2 && best >= Isa::Avx2 {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { avx2::fill_stream(dst, v) };
        }
    }
    let _ = isa;
    dst.fill(v);
}

/// Orders this thread's earlier non-temporal stores before its later stores (`sfence`); a
/// no-op off x86-64, where no streaming stores are issued. (Under Miri, which has no `sfence`
/// and treats streaming stores as ordinary ones, a sequentially consistent fence stands in.)
#[inline]
pub(crate) fn fence() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `sfence` is part of SSE, which every x86-64 CPU has.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(miri)]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Elements of `T` from `p` to the next 64-byte boundary, capped at `len`: the head that
/// streaming kernels write with ordinary stores so the rest starts on a cache line. If whole
/// elements cannot reach a boundary (an address that is not a multiple of the element size),
/// the whole slice is head, so nothing streams — correct, merely slower.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn head_to_line<T>(p: *const T, len: usize) -> usize {
    let size = std::mem::size_of::<T>().max(1);
    let bytes = (64 - (p as usize & 63)) & 63;
    if !bytes.is_multiple_of(size) {
        return len;
    }
    (bytes / size).min(len)
}

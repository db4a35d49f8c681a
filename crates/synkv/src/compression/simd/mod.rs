//! The vector paths: run-time ISA detection and safe dispatchers over the unsafe per-ISA
//! files `avx2.rs` and `avx512.rs` — the only unsafe code of the compression module.
//!
//! Each dispatcher takes the [`Isa`] its caller asks for, lowers it to what the CPU supports
//! (detected once, cached in an atomic) and runs that file's kernel. That check is the whole
//! safety argument for calling the `#[target_feature]` functions: their one precondition is
//! that the CPU has the features. They check slice lengths themselves.
//!
//! A vector kernel handles whole words only (16 elements for 2-bit, 32 for 1-bit) and returns
//! how many *elements* it did; the caller finishes the rest (at most one partial word, or
//! everything at [`Isa::Scalar`]) with the scalar reference. Every kernel gives the scalar
//! reference's bits exactly: the same IEEE operations in the same order (add, compare, then
//! one add or subtract; never fused), ordered comparisons that are false for NaN as the scalar
//! `>=`/`<=`/`>` are, and the layout shuffles of `bits.rs`.
//!
//! The `*_stream` variants write with non-temporal stores, which skip reading the
//! destination's lines into the cache before overwriting them (a normal store's
//! read-for-ownership doubles the memory traffic of a write-only loop); they need
//! vector-aligned addresses, so they cover the aligned middle of the output and return its
//! range, and they end with `sfence` so the stores are ordered before anything the thread
//! does next (such as telling rayon that its piece is done).
//!
//! On targets other than x86-64 only [`Isa::Scalar`] exists and the dispatchers do nothing.
#![allow(unsafe_code)]

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Outputs of at least this many bytes are dequantized with non-temporal stores: beyond the
/// last-level cache they halve the traffic of a write-only loop; below it they would push
/// data the next step (summing the other sources) is about to read out of the cache. The
/// same bound as `kernels::Tuning::DEFAULT.stream_min_bytes`.
pub(crate) const STREAM_MIN_BYTES: usize = 8 << 20;

/// Elements of `out` before its first `align`-byte boundary (all of it if none is reached).
#[cfg(target_arch = "x86_64")]
fn head(out: &[f32], align: usize) -> usize {
    let bytes = (out.as_ptr() as usize).wrapping_neg() % align;
    // an f32 slice is 4-byte aligned, so `bytes` is a whole number of elements
    (bytes / 4).min(out.len())
}

/// How far ahead (in f32 elements: 4 KiB) the vector loops prefetch the arrays they read.
/// The hardware prefetchers stop at page boundaries and must retrain on every 4 KiB page of
/// each stream; a software prefetch one page ahead keeps the loads coming. Measured on the
/// development host (one core, 16 Mi elements): 1-bit quantize 4.8 → 3.3 ms, 2-bit
/// quantize about 5 % faster; 256 elements ahead was too short, 2048 no better.
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 1024;

/// Orders this thread's earlier non-temporal stores before its later stores (`sfence`). Under
/// Miri, which has no `sfence` and treats streaming stores as ordinary ones, a sequentially
/// consistent fence stands in.
#[cfg(target_arch = "x86_64")]
#[inline]
fn fence() {
    #[cfg(not(miri))]
    // SAFETY: `sfence` is part of SSE, which every x86-64 CPU has.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(miri)]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// An instruction-set level of the compression kernels, ordered (a CPU with AVX-512F also
/// has AVX2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    /// Portable Rust: the reference.
    Scalar,
    /// x86-64 AVX2, 8 lanes.
    Avx2,
    /// x86-64 AVX-512F, 16 lanes.
    Avx512,
}

impl Isa {
    /// The best level this CPU runs, detected on first use and cached.
    pub(crate) fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            use std::sync::atomic::{AtomicU8, Ordering};
            static BEST: AtomicU8 = AtomicU8::new(0);
            match BEST.load(Ordering::Relaxed) {
                1 => Isa::Scalar,
                2 => Isa::Avx2,
                3 => Isa::Avx512,
                _ => {
                    let isa = if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx2") {
                        Isa::Avx512
                    } else if is_x86_feature_detected!("avx2") {
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

    /// The level's name: `"avx512"`, `"avx2"` or `"scalar"`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Every level this CPU runs, lowest first (for tests and benches).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|&i| i <= Isa::detected()).collect()
    }
}

/// Generates a dispatcher `fn name(isa, args…) -> R` that runs `avx512::name` or `avx2::name`
/// when both the request and the CPU allow, else returns `nothing` (no element done).
macro_rules! dispatch {
    ($($(#[$m:meta])* fn $name:ident $(<const $c:ident: bool>)? ($($arg:ident: $ty:ty),*) -> $ret:ty = $nothing:expr;)*) => {$(
        $(#[$m])*
        #[inline]
        pub(crate) fn $name $(<const $c: bool>)? (isa: Isa, $($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            match isa.min(Isa::detected()) {
                // SAFETY: `Isa::detected()` found AVX-512F and AVX2 on this CPU.
                Isa::Avx512 => return unsafe { avx512::$name $(::<$c>)? ($($arg),*) },
                // SAFETY: `Isa::detected()` found AVX2 on this CPU.
                Isa::Avx2 => return unsafe { avx2::$name $(::<$c>)? ($($arg),*) },
                Isa::Scalar => {}
            }
            let _ = (isa, $($arg),*);
            $nothing
        }
    )*};
}

dispatch! {
    /// 2-bit quantize of whole 16-element words: `min(grad, residual) / 16` words, capped by
    /// `out.len()`. Returns the elements done.
    fn quantize2(grad: &[f32], residual: &mut [f32], out: &mut [u32], t: f32) -> usize = 0;
    /// 2-bit dequantize (`ADD`: `out += value`, else `out = value`) of whole words:
    /// `out.len() / 16` words, capped by `packed.len()`. Returns the elements done.
    fn dequantize2<const ADD: bool>(packed: &[u32], out: &mut [f32], t: f32) -> usize = 0;
    /// 2-bit dequantize `out = value` with non-temporal stores, over the elements from the
    /// first vector-aligned one to the last whole vector; returns that range (empty if
    /// `packed` is shorter than `ceil(out.len() / 16)`). The caller does the rest.
    fn dequantize2_stream(packed: &[u32], out: &mut [f32], t: f32) -> Range<usize> = 0..0;
    /// 1-bit quantize of whole 32-element words, as [`quantize2`]. Returns the elements done.
    fn quantize1(grad: &[f32], residual: &mut [f32], out: &mut [u32], t: f32) -> usize = 0;
    /// 1-bit dequantize of whole 32-element words, as [`dequantize2`]. Returns the elements done.
    fn dequantize1<const ADD: bool>(packed: &[u32], out: &mut [f32]) -> usize = 0;
    /// 1-bit dequantize with non-temporal stores, as [`dequantize2_stream`].
    fn dequantize1_stream(packed: &[u32], out: &mut [f32]) -> Range<usize> = 0..0;
}

//! f16 and bf16 kernels: computed in f32, in chunks small enough to stay in L1.
//!
//! Each chunk of up to [`CHUNK`] elements is widened to f32 (exact), combined with the f32
//! kernels, and rounded back once per element (round to nearest even). So a K-source sum is
//! `round(((s0 + s1) + s2) + …)` with the additions in f32 — never per-element f64, never a
//! rounding per addition. Conversion and f32 arithmetic run at the plan's ISA level.

use half::{bf16, f16};

use super::simd::{self, Pod};
use super::Isa;

/// Elements per chunk: three f32 buffers of this size live on the stack.
const CHUNK: usize = 256;

/// A 16-bit float stored in memory and computed in f32.
pub(crate) trait Reduced: Pod + Default {
    /// Widens `src[..dst.len()]` into `dst` (exact).
    fn widen(isa: Isa, dst: &mut [f32], src: &[Self]);
    /// Rounds `src[..dst.len()]` into `dst` (nearest even).
    fn narrow(isa: Isa, dst: &mut [Self], src: &[f32]);
}

impl Reduced for f16 {
    #[inline]
    fn widen(isa: Isa, dst: &mut [f32], src: &[Self]) {
        simd::f16_to_f32(isa, dst, src)
    }
    #[inline]
    fn narrow(isa: Isa, dst: &mut [Self], src: &[f32]) {
        simd::f32_to_f16(isa, dst, src)
    }
}

impl Reduced for bf16 {
    #[inline]
    fn widen(isa: Isa, dst: &mut [f32], src: &[Self]) {
        simd::bf16_to_f32(isa, dst, src)
    }
    #[inline]
    fn narrow(isa: Isa, dst: &mut [Self], src: &[f32]) {
        simd::f32_to_bf16(isa, dst, src)
    }
}

/// `dst[i] = round(Σ_k srcs[k][off + i])`, summed in f32 left to right; streams if `stream`.
pub(crate) fn sum<H: Reduced>(isa: Isa, dst: &mut [H], srcs: &[&[H]], off: usize, stream: bool) {
    let (first, rest) = srcs.split_first().expect("sum: no sources");
    let mut acc = [0f32; CHUNK];
    let mut tmp = [0f32; CHUNK];
    let mut out = [H::default(); CHUNK];
    for (c, d) in dst.chunks_mut(CHUNK).enumerate() {
        let (start, m) = (off + c * CHUNK, d.len());
        let acc = &mut acc[..m];
        H::widen(isa, acc, &first[start..start + m]);
        for s in rest {
            H::widen(isa, &mut tmp[..m], &s[start..start + m]);
            simd::add_f32(isa, acc, &tmp[..m]);
        }
        if stream {
            H::narrow(isa, &mut out[..m], acc);
            simd::copy_stream_unfenced(isa, d, &out[..m]);
        } else {
            H::narrow(isa, d, acc);
        }
    }
    if stream {
        simd::fence();
    }
}

/// Applies `f` to `dst` (and the matching part of `src`, if any) widened to f32, chunk by chunk.
#[inline]
fn through_f32<H: Reduced>(isa: Isa, dst: &mut [H], src: Option<&[H]>, f: impl Fn(&mut [f32], &[f32])) {
    let mut d32 = [0f32; CHUNK];
    let mut s32 = [0f32; CHUNK];
    for (c, d) in dst.chunks_mut(CHUNK).enumerate() {
        let m = d.len();
        H::widen(isa, &mut d32[..m], d);
        if let Some(src) = src {
            H::widen(isa, &mut s32[..m], &src[c * CHUNK..c * CHUNK + m]);
        }
        f(&mut d32[..m], &s32[..m]);
        H::narrow(isa, d, &d32[..m]);
    }
}

/// `dst = round(dst + src)`, in f32.
pub(crate) fn add<H: Reduced>(isa: Isa, dst: &mut [H], src: &[H]) {
    through_f32(isa, dst, Some(src), |d, s| simd::add_f32(isa, d, s));
}

/// `dst = round(dst + a * x)`, in f32 with two roundings.
pub(crate) fn axpy<H: Reduced>(isa: Isa, dst: &mut [H], a: f32, x: &[H]) {
    through_f32(isa, dst, Some(x), |d, x| simd::axpy_f32(isa, d, a, x));
}

/// `dst = round(dst * a)`, in f32.
pub(crate) fn scale<H: Reduced>(isa: Isa, dst: &mut [H], a: f32) {
    through_f32(isa, dst, None, |d, _| simd::scale_f32(isa, d, a));
}

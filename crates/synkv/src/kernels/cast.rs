//! `cast` between any two element types.
//!
//! The meaning is always `dst[i] = U::from_f64(src[i].to_f64())`; the fast paths below are
//! chosen only where they give the same bits:
//! - same type: a bit copy (streamed for large destinations);
//! - from f32, f16 or bf16 (exact in f32): widen to f32, then narrow once — one rounding from
//!   the same exact value, as through f64;
//! - from anything else: through an f64 chunk, then `from_f64` (f64 → f16 narrows through f32,
//!   with rounding to odd, then the vector f32 → f16/bf16 conversion, exactly as
//!   `Element for f16`/`bf16` define `from_f64`).
//!
//! Work goes through [`CHUNK`]-element stack buffers so it stays in L1.

use super::element::{f64_to_f32_odd, View, ViewMut};
use super::ops::copy_pod;
use super::parallel::for_chunks;
use super::tuning::Plan;
use super::{scalar, simd, Element, Isa};

const CHUNK: usize = 256;

/// `dst[i] = U::from_f64(src[i].to_f64())`; callers checked the lengths agree.
pub(crate) fn cast<T: Element, U: Element>(plan: &Plan, dst: &mut [U], src: &[T]) {
    match (U::view_mut(&mut *dst), T::view(src)) {
        (ViewMut::F32(d), View::F32(s)) => return copy_pod(plan, d, s),
        (ViewMut::F64(d), View::F64(s)) => return copy_pod(plan, d, s),
        (ViewMut::F16(d), View::F16(s)) => return copy_pod(plan, d, s),
        (ViewMut::Bf16(d), View::Bf16(s)) => return copy_pod(plan, d, s),
        (ViewMut::I32(d), View::I32(s)) => return copy_pod(plan, d, s),
        (ViewMut::I64(d), View::I64(s)) => return copy_pod(plan, d, s),
        _ => {}
    }
    let isa = plan.isa;
    for_chunks(plan, dst, |piece, off| {
        let mut narrow = [0f32; CHUNK];
        let mut wide = [0f64; CHUNK];
        for (c, d) in piece.chunks_mut(CHUNK).enumerate() {
            let start = off + c * CHUNK;
            let s = &src[start..start + d.len()];
            cast_chunk(isa, d, s, &mut narrow, &mut wide);
        }
    });
}

/// One chunk of at most `CHUNK` elements, with scratch buffers from the caller.
fn cast_chunk<T: Element, U: Element>(isa: Isa, dst: &mut [U], src: &[T], narrow: &mut [f32; CHUNK], wide: &mut [f64; CHUNK]) {
    let b = &mut narrow[..dst.len()];
    let exact_in_f32 = match T::view(src) {
        View::F32(s) => {
            b.copy_from_slice(s);
            true
        }
        View::F16(s) => {
            simd::f16_to_f32(isa, b, s);
            true
        }
        View::Bf16(s) => {
            simd::bf16_to_f32(isa, b, s);
            true
        }
        _ => false,
    };
    if exact_in_f32 {
        return from_f32(isa, dst, b);
    }
    let w = &mut wide[..dst.len()];
    scalar::convert(w, src, T::to_f64);
    match U::view_mut(dst) {
        ViewMut::F32(d) => scalar::convert(d, w, |v| v as f32),
        ViewMut::F64(d) => d.copy_from_slice(w),
        ViewMut::F16(d) => {
            scalar::convert(b, w, f64_to_f32_odd);
            simd::f32_to_f16(isa, d, b);
        }
        ViewMut::Bf16(d) => {
            scalar::convert(b, w, f64_to_f32_odd);
            simd::f32_to_bf16(isa, d, b);
        }
        ViewMut::I32(d) => scalar::convert(d, w, i32::from_f64),
        ViewMut::I64(d) => scalar::convert(d, w, i64::from_f64),
        ViewMut::Other(d) => scalar::convert(d, w, U::from_f64),
    }
}

/// `dst[i] = U::from_f64(b[i] as f64)`, with the vector conversions where they exist.
fn from_f32<U: Element>(isa: Isa, dst: &mut [U], b: &[f32]) {
    match U::view_mut(dst) {
        ViewMut::F32(d) => d.copy_from_slice(b),
        ViewMut::F64(d) => scalar::convert(d, b, f64::from),
        ViewMut::F16(d) => simd::f32_to_f16(isa, d, b),
        ViewMut::Bf16(d) => simd::f32_to_bf16(isa, d, b),
        ViewMut::I32(d) => scalar::convert(d, b, |v| i32::from_f64(f64::from(v))),
        ViewMut::I64(d) => scalar::convert(d, b, |v| i64::from_f64(f64::from(v))),
        ViewMut::Other(d) => scalar::convert(d, b, |v| U::from_f64(f64::from(v))),
    }
}

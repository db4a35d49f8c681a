//! Portable kernels: the reference every SIMD path must match bit for bit, and the
//! [`Isa::Scalar`](super::Isa::Scalar) path itself.
//!
//! Plain safe loops, written so the compiler can auto-vectorise them. Every function is
//! `#[inline(always)]`: the `simd` files instantiate the same bodies inside
//! `#[target_feature]` functions, so one source yields AVX2 and AVX-512 versions of the simple
//! element-wise loops. Functions work on one chunk; "`off`" is the chunk's offset into the
//! sources, whose slices are the whole arrays (the parallel driver splits only the destination).
//!
//! Order of operations (it fixes the rounding, so every path must keep it):
//! - `sum`: `((s0 + s1) + s2) + …` per element, in the type's own arithmetic;
//! - `axpy`: `d + (a * x)` as two roundings — never a fused multiply-add;
//! - integers add with wrapping, and compute `axpy`/`scale` in f64 then round (`from_f64`).

use half::{bf16, f16, slice::HalfFloatSliceExt};

use super::Element;

/// Elements per block when summing more than two sources: the block of `dst` stays in L1
/// while each further source is added into it.
const BLOCK: usize = 512;

/// `dst[i] = ((srcs[0][off+i] + srcs[1][off+i]) + …)` with the given addition.
///
/// Callers guarantee `srcs` is not empty and every source has at least `off + dst.len()`
/// elements (slicing panics otherwise).
#[inline(always)]
pub(crate) fn sum_with<T: Copy>(dst: &mut [T], srcs: &[&[T]], off: usize, add: impl Fn(T, T) -> T) {
    let n = dst.len();
    let mut start = 0;
    while start < n {
        let end = (start + BLOCK).min(n);
        let d = &mut dst[start..end];
        let s0 = &srcs[0][off + start..off + end];
        match srcs.get(1) {
            None => d.copy_from_slice(s0),
            Some(s1) => {
                let s1 = &s1[off + start..off + end];
                for ((d, &a), &b) in d.iter_mut().zip(s0).zip(s1) {
                    *d = add(a, b);
                }
                for s in &srcs[2..] {
                    for (d, &x) in d.iter_mut().zip(&s[off + start..off + end]) {
                        *d = add(*d, x);
                    }
                }
            }
        }
        start = end;
    }
}

/// `dst[i] = f(dst[i], src[i])`; `src` has at least `dst.len()` elements.
#[inline(always)]
pub(crate) fn zip_with<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    let src = &src[..dst.len()];
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f(*d, s);
    }
}

/// `dst[i] = f(dst[i])`.
#[inline(always)]
pub(crate) fn map<T: Copy>(dst: &mut [T], f: impl Fn(T) -> T) {
    for d in dst.iter_mut() {
        *d = f(*d);
    }
}

/// `dst[i] = f(src[i])`, between two element types; `src` has at least `dst.len()` elements.
#[inline(always)]
pub(crate) fn convert<S: Copy, D: Copy>(dst: &mut [D], src: &[S], f: impl Fn(S) -> D) {
    let src = &src[..dst.len()];
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f(s);
    }
}

macro_rules! float_kernels {
    ($t:ty, $sum:ident, $add:ident, $axpy:ident, $scale:ident) => {
        #[doc = concat!("`sum` for `", stringify!($t), "`.")]
        #[inline(always)]
        pub(crate) fn $sum(dst: &mut [$t], srcs: &[&[$t]], off: usize) {
            sum_with(dst, srcs, off, |a, b| a + b);
        }
        #[doc = concat!("`dst += src` for `", stringify!($t), "`.")]
        #[inline(always)]
        pub(crate) fn $add(dst: &mut [$t], src: &[$t]) {
            zip_with(dst, src, |d, s| d + s);
        }
        #[doc = concat!("`dst = dst + (a * x)` for `", stringify!($t), "` (two roundings).")]
        #[inline(always)]
        pub(crate) fn $axpy(dst: &mut [$t], a: $t, x: &[$t]) {
            zip_with(dst, x, |d, x| d + a * x);
        }
        #[doc = concat!("`dst *= a` for `", stringify!($t), "`.")]
        #[inline(always)]
        pub(crate) fn $scale(dst: &mut [$t], a: $t) {
            map(dst, |d| d * a);
        }
    };
}
float_kernels!(f32, sum_f32, add_f32, axpy_f32, scale_f32);
float_kernels!(f64, sum_f64, add_f64, axpy_f64, scale_f64);

macro_rules! int_kernels {
    ($t:ty, $sum:ident, $add:ident, $axpy:ident, $scale:ident) => {
        #[doc = concat!("`sum` for `", stringify!($t), "`, wrapping on overflow.")]
        #[inline(always)]
        pub(crate) fn $sum(dst: &mut [$t], srcs: &[&[$t]], off: usize) {
            sum_with(dst, srcs, off, <$t>::wrapping_add);
        }
        #[doc = concat!("`dst += src` for `", stringify!($t), "`, wrapping on overflow.")]
        #[inline(always)]
        pub(crate) fn $add(dst: &mut [$t], src: &[$t]) {
            zip_with(dst, src, <$t>::wrapping_add);
        }
        #[doc = concat!("`dst = round(dst + a * x)` for `", stringify!($t), "`, in f64.")]
        #[inline(always)]
        pub(crate) fn $axpy(dst: &mut [$t], a: f64, x: &[$t]) {
            zip_with(dst, x, |d, x| <$t>::from_f64(d as f64 + a * x as f64));
        }
        #[doc = concat!("`dst = round(dst * a)` for `", stringify!($t), "`, in f64.")]
        #[inline(always)]
        pub(crate) fn $scale(dst: &mut [$t], a: f64) {
            map(dst, |d| <$t>::from_f64(d as f64 * a));
        }
    };
}
int_kernels!(i32, sum_i32, add_i32, axpy_i32, scale_i32);
int_kernels!(i64, sum_i64, add_i64, axpy_i64, scale_i64);

/// `sum` for element types without a fast path: accumulate in f64, round once (the stub's
/// semantics).
pub(crate) fn sum_generic<T: Element>(dst: &mut [T], srcs: &[&[T]], off: usize) {
    for (i, d) in dst.iter_mut().enumerate() {
        let mut acc = srcs[0][off + i].to_f64();
        for s in &srcs[1..] {
            acc += s[off + i].to_f64();
        }
        *d = T::from_f64(acc);
    }
}

/// `dst += src` through f64, for element types without a fast path.
pub(crate) fn add_generic<T: Element>(dst: &mut [T], src: &[T]) {
    zip_with(dst, src, |d, s| T::from_f64(d.to_f64() + s.to_f64()));
}

/// `dst += a * x` through f64, for element types without a fast path.
pub(crate) fn axpy_generic<T: Element>(dst: &mut [T], a: f64, x: &[T]) {
    zip_with(dst, x, |d, x| T::from_f64(d.to_f64() + a * x.to_f64()));
}

/// `dst *= a` through f64, for element types without a fast path.
pub(crate) fn scale_generic<T: Element>(dst: &mut [T], a: f64) {
    map(dst, |d| T::from_f64(d.to_f64() * a));
}

/// f16 → f32 (exact), with `half`'s slice conversion (F16C when the CPU has it).
pub(crate) fn f16_to_f32(dst: &mut [f32], src: &[f16]) {
    src[..dst.len()].convert_to_f32_slice(dst);
}

/// f32 → f16, round to nearest even, with `half`'s slice conversion.
pub(crate) fn f32_to_f16(dst: &mut [f16], src: &[f32]) {
    dst.convert_from_f32_slice(&src[..dst.len()]);
}

/// bf16 → f32 (exact): the bf16 bits are the top half of the f32. A NaN gets its quiet bit
/// set, exactly like `bf16::to_f32`.
#[inline(always)]
pub(crate) fn bf16_to_f32(dst: &mut [f32], src: &[bf16]) {
    convert(dst, src, |b| {
        let b = u32::from(b.to_bits());
        let b = if b & 0x7fff > 0x7f80 { b | 0x40 } else { b };
        f32::from_bits(b << 16)
    });
}

/// One f32 → bf16, round to nearest even; NaN stays NaN (quiet bit set), exactly like
/// `bf16::from_f32`, but branch-free so loops over it vectorise.
#[inline(always)]
pub(crate) fn f32_to_bf16_one(v: f32) -> bf16 {
    let x = v.to_bits();
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    let nan = ((x >> 16) | 0x40) & 0xffff;
    let bits = if x & 0x7fff_ffff > 0x7f80_0000 { nan } else { rounded };
    bf16::from_bits(bits as u16)
}

/// f32 → bf16, round to nearest even (see [`f32_to_bf16_one`]).
#[inline(always)]
pub(crate) fn f32_to_bf16(dst: &mut [bf16], src: &[f32]) {
    convert(dst, src, f32_to_bf16_one);
}

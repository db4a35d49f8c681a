//! AVX-512F kernels (512-bit vectors), x86-64 only.
//!
//! Every function here is an `unsafe fn` with one precondition: the CPU supports AVX-512F,
//! AVX2 and F16C (`super::best_isa()` returned [`Isa::Avx512`](crate::kernels::Isa::Avx512)).
//! Slice lengths are checked inside, so the functions are otherwise safe to call. Hand-written:
//! f16 ↔ f32 conversion (16 lanes) and streaming copy/fill. The element-wise loops are
//! `scalar.rs` bodies recompiled for AVX-512F by `instantiate!` (about 20 % faster than AVX2 on
//! L1-resident data here); the K-source sums reuse the AVX2 kernels (see [`sum_f32`]).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::{head_to_line, instantiate, Pod};

instantiate! { "avx512f,avx2,f16c", "AVX-512F";
    fn sum_i32(dst: &mut [i32], srcs: &[&[i32]], off: usize);
    fn sum_i64(dst: &mut [i64], srcs: &[&[i64]], off: usize);
    fn add_f32(dst: &mut [f32], src: &[f32]);
    fn add_f64(dst: &mut [f64], src: &[f64]);
    fn add_i32(dst: &mut [i32], src: &[i32]);
    fn add_i64(dst: &mut [i64], src: &[i64]);
    fn axpy_f32(dst: &mut [f32], a: f32, x: &[f32]);
    fn axpy_f64(dst: &mut [f64], a: f64, x: &[f64]);
    fn axpy_i32(dst: &mut [i32], a: f64, x: &[i32]);
    fn axpy_i64(dst: &mut [i64], a: f64, x: &[i64]);
    fn scale_f32(dst: &mut [f32], a: f32);
    fn scale_f64(dst: &mut [f64], a: f64);
    fn scale_i32(dst: &mut [i32], a: f64);
    fn scale_i64(dst: &mut [i64], a: f64);
    fn bf16_to_f32(dst: &mut [f32], src: &[bf16]);
    fn f32_to_bf16(dst: &mut [bf16], src: &[f32]);
}

/// `_mm512_stream_si512`, or under Miri (which cannot run its inline assembly) the aligned
/// store with the same alignment requirement, so Miri still checks it.
///
/// # Safety
/// AVX-512F available; `p` valid for a 64-byte write and 64-byte aligned.
#[target_feature(enable = "avx512f,avx2,f16c")]
#[inline]
unsafe fn stream_si512(p: *mut __m512i, v: __m512i) {
    // SAFETY: forwarded from this function's contract.
    #[cfg(not(miri))]
    unsafe {
        _mm512_stream_si512(p, v)
    }
    // SAFETY: forwarded from this function's contract.
    #[cfg(miri)]
    unsafe {
        _mm512_store_si512(p, v)
    }
}

/// `dst[i] = Σ_k srcs[k][off + i]` for f32: the AVX2 kernel. Measured on Zen 4/5 (the
/// development host), a 512-bit version was no faster from L1 and 5–10 % slower streaming from
/// DRAM (with or without non-temporal stores), so this level reuses the 256-bit loop.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and F16C.
#[target_feature(enable = "avx512f,avx2,f16c")]
pub(super) unsafe fn sum_f32(dst: &mut [f32], srcs: &[&[f32]], off: usize, stream: bool) {
    // SAFETY: AVX2 and F16C are available (our precondition).
    unsafe { super::avx2::sum_f32(dst, srcs, off, stream) }
}

/// `dst[i] = Σ_k srcs[k][off + i]` for f64: the AVX2 kernel, as for [`sum_f32`].
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and F16C.
#[target_feature(enable = "avx512f,avx2,f16c")]
pub(super) unsafe fn sum_f64(dst: &mut [f64], srcs: &[&[f64]], off: usize, stream: bool) {
    // SAFETY: AVX2 and F16C are available (our precondition).
    unsafe { super::avx2::sum_f64(dst, srcs, off, stream) }
}

/// f16 → f32 (exact) for `dst.len()` elements, 16 per `vcvtph2ps`.
///
/// # Safety
/// The CPU must support AVX-512F. (Panics if `src` is shorter than `dst`.)
#[target_feature(enable = "avx512f,avx2,f16c")]
pub(super) unsafe fn f16_to_f32(dst: &mut [f32], src: &[f16]) {
    let n = dst.len();
    let src = &src[..n];
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n: 32 bytes read from `src`, 64 bytes written to `dst`, in bounds.
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        }
        i += 16;
    }
    if i < n {
        let mut h = [f16::ZERO; 16];
        let mut f = [0f32; 16];
        h[..n - i].copy_from_slice(&src[i..]);
        // SAFETY: both buffers hold 16 elements.
        unsafe {
            let v = _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr().cast()));
            _mm512_storeu_ps(f.as_mut_ptr(), v);
        }
        dst[i..].copy_from_slice(&f[..n - i]);
    }
}

/// f32 → f16, round to nearest even, for `dst.len()` elements, 16 per `vcvtps2ph`.
///
/// # Safety
/// The CPU must support AVX-512F. (Panics if `src` is shorter than `dst`.)
#[target_feature(enable = "avx512f,avx2,f16c")]
pub(super) unsafe fn f32_to_f16(dst: &mut [f16], src: &[f32]) {
    const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    let n = dst.len();
    let src = &src[..n];
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n: 64 bytes read from `src`, 32 bytes written to `dst`, in bounds.
        unsafe {
            let h = _mm512_cvtps_ph::<RNE>(_mm512_loadu_ps(src.as_ptr().add(i)));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), h);
        }
        i += 16;
    }
    if i < n {
        let mut f = [0f32; 16];
        let mut h = [f16::ZERO; 16];
        f[..n - i].copy_from_slice(&src[i..]);
        // SAFETY: both buffers hold 16 elements.
        unsafe {
            let v = _mm512_cvtps_ph::<RNE>(_mm512_loadu_ps(f.as_ptr()));
            _mm256_storeu_si256(h.as_mut_ptr().cast(), v);
        }
        dst[i..].copy_from_slice(&h[..n - i]);
    }
}

/// Copies `src` into `dst` (equal lengths), whole destination cache lines with non-temporal
/// stores, the partial lines at either end with ordinary ones. No closing fence.
///
/// # Safety
/// The CPU must support AVX-512F. (Panics if the lengths differ.)
#[target_feature(enable = "avx512f,avx2,f16c")]
pub(super) unsafe fn copy_stream<T: Pod>(dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "copy: length mismatch");
    let size = std::mem::size_of::<T>();
    let head = head_to_line(dst.as_ptr(), dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    let lines = (dst.len() - head) * size / 64;
    let d = dst[head..].as_mut_ptr().cast::<u8>();
    let s = src[head..].as_ptr().cast::<u8>();
    let mut l = 0;
    // SAFETY: `d` is 64-byte aligned (the head ends on a line) and `lines` whole lines fit in
    // both slices after `head`; `T: Pod` makes them plain bytes. Slices do not overlap.
    unsafe {
        while l + 4 <= lines {
            let (p, q) = (s.add(l * 64), d.add(l * 64));
            let v0 = _mm512_loadu_si512(p.cast());
            let v1 = _mm512_loadu_si512(p.add(64).cast());
            let v2 = _mm512_loadu_si512(p.add(128).cast());
            let v3 = _mm512_loadu_si512(p.add(192).cast());
            stream_si512(q.cast(), v0);
            stream_si512(q.add(64).cast(), v1);
            stream_si512(q.add(128).cast(), v2);
            stream_si512(q.add(192).cast(), v3);
            l += 4;
        }
        while l < lines {
            let v = _mm512_loadu_si512(s.add(l * 64).cast());
            stream_si512(d.add(l * 64).cast(), v);
            l += 1;
        }
    }
    let done = head + lines * 64 / size;
    dst[done..].copy_from_slice(&src[done..]);
}

/// Fills `dst` with `v`: whole cache lines with non-temporal stores, partial ones ordinarily.
/// No closing fence.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f,avx2,f16c")]
pub(super) unsafe fn fill_stream<T: Pod>(dst: &mut [T], v: T) {
    let size = std::mem::size_of::<T>();
    let head = head_to_line(dst.as_ptr(), dst.len());
    dst[..head].fill(v);
    let lines = (dst.len() - head) * size / 64;
    let pattern = [v; 64];
    // SAFETY: `pattern` holds at least 64 bytes; `T: Pod` makes them plain bytes.
    let line = unsafe { _mm512_loadu_si512(pattern.as_ptr().cast()) };
    let d = dst[head..].as_mut_ptr().cast::<u8>();
    for l in 0..lines {
        // SAFETY: `d` is line-aligned and `lines` whole lines fit after `head`. Elements
        // start on the line boundary (size divides 64), so the pattern lines up with them.
        unsafe { stream_si512(d.add(l * 64).cast(), line) };
    }
    let done = head + lines * 64 / size;
    dst[done..].fill(v);
}

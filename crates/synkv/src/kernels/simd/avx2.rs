//! AVX2 kernels (256-bit vectors, F16C for half conversion), x86-64 only.
//!
//! Every function here is an `unsafe fn` with one precondition: the CPU supports AVX2 and F16C
//! (`super::best_isa()` returned at least [`Isa::Avx2`](crate::kernels::Isa::Avx2)). Slice
//! lengths are checked inside. Hand-written: the K-source sums (with an optional streaming
//! store), f16 ↔ f32 conversion, and streaming copy/fill; the rest are `scalar.rs` bodies
//! recompiled for AVX2 by `instantiate!`.
//!
//! Sums add sources in order, lane by lane, with plain `vaddps`/`vaddpd` (never FMA), so each
//! element sees exactly the scalar reference's roundings. Tails run the scalar loop.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::{head_to_line, instantiate, Pod};

instantiate! { "avx2,f16c", "AVX2 and F16C";
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

/// Generates a non-temporal store wrapper: the streaming intrinsic, or under Miri (which cannot
/// run their inline assembly) the aligned store with the same alignment requirement, so Miri
/// still checks it.
macro_rules! stream_store {
    ($name:ident, $p:ty, $v:ty, $stream:ident, $aligned:ident) => {
        #[doc = concat!("`", stringify!($stream), "` (`", stringify!($aligned), "` under Miri).")]
        ///
        /// # Safety
        /// AVX2 available; `p` valid for a vector-sized write and aligned to the vector size.
        #[target_feature(enable = "avx2,f16c")]
        #[inline]
        unsafe fn $name(p: $p, v: $v) {
            // SAFETY: forwarded from this function's contract.
            #[cfg(not(miri))]
            unsafe {
                $stream(p, v)
            }
            // SAFETY: forwarded from this function's contract.
            #[cfg(miri)]
            unsafe {
                $aligned(p, v)
            }
        }
    };
}
stream_store!(stream_ps, *mut f32, __m256, _mm256_stream_ps, _mm256_store_ps);
stream_store!(stream_pd, *mut f64, __m256d, _mm256_stream_pd, _mm256_store_pd);
stream_store!(stream_si256, *mut __m256i, __m256i, _mm256_stream_si256, _mm256_store_si256);

/// Generates a K-source sum: `$name` (the checked entry point) over `$imp` (the loop).
macro_rules! sum_kernel {
    ($name:ident, $imp:ident, $t:ty, $lanes:literal,
     $load:ident, $add:ident, $store:ident, $stream:ident) => {
        #[doc = concat!("`dst[i] = Σ_k srcs[k][off + i]` for `", stringify!($t), "`, left to right;")]
        /// non-temporal stores for whole cache lines when `stream` (then ends with `sfence`).
        ///
        /// # Safety
        /// The CPU must support AVX2. (Lengths are checked: panics if `srcs` is empty or a
        /// source is shorter than `off + dst.len()`.)
        #[target_feature(enable = "avx2,f16c")]
        pub(super) unsafe fn $name(dst: &mut [$t], srcs: &[&[$t]], off: usize, stream: bool) {
            let n = dst.len();
            assert!(!srcs.is_empty(), "sum: no sources");
            for s in srcs {
                assert!(s.len() >= off && s.len() - off >= n, "sum: source too short");
            }
            let d = dst.as_mut_ptr();
            // SAFETY: AVX2 is available (our precondition); `d` is valid for `n` writes and
            // every source for `n` reads from `off` (asserted above).
            unsafe {
                if stream {
                    $imp::<true>(d, srcs, off, n)
                } else {
                    $imp::<false>(d, srcs, off, n)
                }
            }
        }

        /// The loop behind the entry point of the same type.
        ///
        /// # Safety
        /// AVX2 available; `srcs` not empty; `d` valid for `n` writes; each source valid for
        /// reads of `off..off + n`; `d` overlaps no source.
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn $imp<const STREAM: bool>(d: *mut $t, srcs: &[&[$t]], off: usize, n: usize) {
            const L: usize = $lanes;
            let (first, rest) = srcs.split_first().expect("sum: no sources");
            let at = |s: &[$t], i: usize| s.as_ptr().wrapping_add(off + i);
            // One element, the scalar way (head and tail).
            let one = |i: usize| {
                // SAFETY: callers pass i < n, so every read and the write are in bounds.
                unsafe {
                    let mut acc = *at(first, i);
                    for s in rest {
                        acc += *at(s, i);
                    }
                    *d.add(i) = acc;
                }
            };
            let mut i = 0;
            if STREAM {
                // Scalar stores up to the first cache-line boundary of the destination.
                let head = head_to_line(d, n);
                while i < head {
                    one(i);
                    i += 1;
                }
            }
            while i + 4 * L <= n {
                // SAFETY: i + 4L <= n: all reads and writes are in bounds. With STREAM the
                // destination is 64-byte aligned here (the head loop stopped on a line
                // boundary and each step advances by whole lines), as `$stream` requires.
                unsafe {
                    let p = at(first, i);
                    let mut a0 = $load(p);
                    let mut a1 = $load(p.add(L));
                    let mut a2 = $load(p.add(2 * L));
                    let mut a3 = $load(p.add(3 * L));
                    for s in rest {
                        let p = at(s, i);
                        a0 = $add(a0, $load(p));
                        a1 = $add(a1, $load(p.add(L)));
                        a2 = $add(a2, $load(p.add(2 * L)));
                        a3 = $add(a3, $load(p.add(3 * L)));
                    }
                    let q = d.add(i);
                    if STREAM {
                        $stream(q, a0);
                        $stream(q.add(L), a1);
                        $stream(q.add(2 * L), a2);
                        $stream(q.add(3 * L), a3);
                    } else {
                        $store(q, a0);
                        $store(q.add(L), a1);
                        $store(q.add(2 * L), a2);
                        $store(q.add(3 * L), a3);
                    }
                }
                i += 4 * L;
            }
            while i + L <= n {
                // SAFETY: i + L <= n; no streaming here (ordinary unaligned stores).
                unsafe {
                    let mut a = $load(at(first, i));
                    for s in rest {
                        a = $add(a, $load(at(s, i)));
                    }
                    $store(d.add(i), a);
                }
                i += L;
            }
            while i < n {
                one(i);
                i += 1;
            }
            if STREAM {
                super::fence();
            }
        }
    };
}

sum_kernel!(sum_f32, sum_f32_loop, f32, 8, _mm256_loadu_ps, _mm256_add_ps, _mm256_storeu_ps, stream_ps);
sum_kernel!(sum_f64, sum_f64_loop, f64, 4, _mm256_loadu_pd, _mm256_add_pd, _mm256_storeu_pd, stream_pd);

/// f16 → f32 (exact) for `dst.len()` elements, 8 per `vcvtph2ps`.
///
/// # Safety
/// The CPU must support AVX2 and F16C. (Panics if `src` is shorter than `dst`.)
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16_to_f32(dst: &mut [f32], src: &[f16]) {
    let n = dst.len();
    let src = &src[..n];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n: 16 bytes read from `src`, 32 bytes written to `dst`, in bounds.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    if i < n {
        let mut h = [f16::ZERO; 8];
        let mut f = [0f32; 8];
        h[..n - i].copy_from_slice(&src[i..]);
        // SAFETY: both buffers hold 8 elements.
        unsafe { _mm256_storeu_ps(f.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast()))) };
        dst[i..].copy_from_slice(&f[..n - i]);
    }
}

/// f32 → f16, round to nearest even, for `dst.len()` elements, 8 per `vcvtps2ph`.
///
/// # Safety
/// The CPU must support AVX2 and F16C. (Panics if `src` is shorter than `dst`.)
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f32_to_f16(dst: &mut [f16], src: &[f32]) {
    const RNE: i32 = _MM_FROUND_TO_NEAREST_INT;
    let n = dst.len();
    let src = &src[..n];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n: 32 bytes read from `src`, 16 bytes written to `dst`, in bounds.
        unsafe {
            let h = _mm256_cvtps_ph::<RNE>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
        }
        i += 8;
    }
    if i < n {
        let mut f = [0f32; 8];
        let mut h = [f16::ZERO; 8];
        f[..n - i].copy_from_slice(&src[i..]);
        // SAFETY: both buffers hold 8 elements.
        unsafe { _mm_storeu_si128(h.as_mut_ptr().cast(), _mm256_cvtps_ph::<RNE>(_mm256_loadu_ps(f.as_ptr()))) };
        dst[i..].copy_from_slice(&h[..n - i]);
    }
}

/// Copies `src` into `dst` (equal lengths), whole destination cache lines with non-temporal
/// stores, the partial lines at either end with ordinary ones. No closing fence.
///
/// # Safety
/// The CPU must support AVX2. (Panics if the lengths differ.)
#[target_feature(enable = "avx2,f16c")]
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
        while l + 2 <= lines {
            let (p, q) = (s.add(l * 64), d.add(l * 64));
            let v0 = _mm256_loadu_si256(p.cast());
            let v1 = _mm256_loadu_si256(p.add(32).cast());
            let v2 = _mm256_loadu_si256(p.add(64).cast());
            let v3 = _mm256_loadu_si256(p.add(96).cast());
            stream_si256(q.cast(), v0);
            stream_si256(q.add(32).cast(), v1);
            stream_si256(q.add(64).cast(), v2);
            stream_si256(q.add(96).cast(), v3);
            l += 2;
        }
        if l < lines {
            let (p, q) = (s.add(l * 64), d.add(l * 64));
            stream_si256(q.cast(), _mm256_loadu_si256(p.cast()));
            stream_si256(q.add(32).cast(), _mm256_loadu_si256(p.add(32).cast()));
        }
    }
    let done = head + lines * 64 / size;
    dst[done..].copy_from_slice(&src[done..]);
}

/// Fills `dst` with `v`: whole cache lines with non-temporal stores, partial ones ordinarily.
/// No closing fence.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn fill_stream<T: Pod>(dst: &mut [T], v: T) {
    let size = std::mem::size_of::<T>();
    let head = head_to_line(dst.as_ptr(), dst.len());
    dst[..head].fill(v);
    let lines = (dst.len() - head) * size / 64;
    let pattern = [v; 32];
    // SAFETY: `pattern` holds at least 32 bytes; `T: Pod` makes them plain bytes.
    let half_line = unsafe { _mm256_loadu_si256(pattern.as_ptr().cast()) };
    let d = dst[head..].as_mut_ptr().cast::<u8>();
    for l in 0..lines {
        // SAFETY: `d` is line-aligned and `lines` whole lines fit after `head`. Elements
        // start on the line boundary (size divides 32), so the pattern lines up with them.
        unsafe {
            stream_si256(d.add(l * 64).cast(), half_line);
            stream_si256(d.add(l * 64 + 32).cast(), half_line);
        }
    }
    let done = head + lines * 64 / size;
    dst[done..].fill(v);
}

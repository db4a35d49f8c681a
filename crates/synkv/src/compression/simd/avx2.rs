//! AVX2 compression kernels: two 8-lane vectors per 2-bit word, four per 1-bit word.
//!
//! Every function is an `unsafe fn` whose one precondition is that the CPU supports AVX2
//! (`Isa::detected()` returned at least `Isa::Avx2`); slice lengths are checked inside, so
//! nothing is read or written out of bounds whatever the arguments.
//!
//! Quantize reverses the lanes of each group of 4 (2-bit, `vpermilps`) or all 8 (1-bit,
//! `vpermps`) so that `vmovmskps` gives the masks in the packed bit order (see `bits.rs`),
//! and reverses them back before storing the residual. Dequantize broadcasts the word and
//! tests one bit per lane. Loops that read a large array prefetch it a page ahead
//! (`super::PREFETCH`). The streaming dequantize starts at the first 32-byte boundary of the
//! output, so a vector may straddle two words: each lane then picks its word and its bit
//! from a per-call layout (`bits::lanes`).
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::bits::{interleave, lanes, Lanes, ONE_BIT, TWO_BIT_HI, TWO_BIT_LO};
use super::{fence, head, PREFETCH};

/// `vpermilps` control reversing each group of 4 lanes.
const REVERSE4: i32 = 0b00_01_10_11;

/// All ones in the lanes of `b` that have a bit of `bits` set, zeros elsewhere.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn test(b: __m256i, bits: __m256i) -> __m256 {
    _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, bits), bits))
}

/// Loads 8 `u32`s of a bit table from `at`.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn table(at: &[u32]) -> __m256i {
    assert!(at.len() >= 8);
    // SAFETY: 8 `u32`s are readable from `at` (checked above); unaligned load.
    unsafe { _mm256_loadu_si256(at.as_ptr().cast()) }
}

/// 2-bit quantize of whole words (see `super::quantize2`); returns the elements done.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize2(grad: &[f32], residual: &mut [f32], out: &mut [u32], t: f32) -> usize {
    let words = (grad.len().min(residual.len()) / 16).min(out.len());
    let (tv, ntv) = (_mm256_set1_ps(t), _mm256_set1_ps(-t));
    let (g, r) = (grad.as_ptr(), residual.as_mut_ptr());
    for (k, o) in out[..words].iter_mut().enumerate() {
        let (mut hi, mut lo) = (0u32, 0u32);
        // one 64-byte line of each array per word (a prefetch never faults, so addresses
        // past the end are harmless)
        _mm_prefetch::<_MM_HINT_T0>(g.wrapping_add(16 * k + PREFETCH).cast());
        _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add(16 * k + PREFETCH).cast());
        for h in 0..2 {
            let i = 16 * k + 8 * h;
            // SAFETY: `i + 8 <= 16·words <= len` of both `grad` and `residual`.
            let (gv, rv) = unsafe { (_mm256_loadu_ps(g.add(i)), _mm256_loadu_ps(r.add(i))) };
            let s = _mm256_permute_ps::<REVERSE4>(_mm256_add_ps(rv, gv));
            let pos = _mm256_cmp_ps::<_CMP_GE_OQ>(s, tv);
            // `else if`: a lane that is `>= t` never also counts as `<= −t` (possible when t <= 0).
            let neg = _mm256_andnot_ps(pos, _mm256_cmp_ps::<_CMP_LE_OQ>(s, ntv));
            let s = _mm256_blendv_ps(_mm256_blendv_ps(s, _mm256_add_ps(s, tv), neg), _mm256_sub_ps(s, tv), pos);
            // SAFETY: as for the load.
            unsafe { _mm256_storeu_ps(r.add(i), _mm256_permute_ps::<REVERSE4>(s)) };
            hi |= (_mm256_movemask_ps(_mm256_or_ps(pos, neg)) as u32) << (8 * h);
            lo |= (_mm256_movemask_ps(pos) as u32) << (8 * h);
        }
        *o = interleave(hi as u16, lo as u16);
    }
    16 * words
}

/// 2-bit dequantize of whole words (see `super::dequantize2`); returns the elements done.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dequantize2<const ADD: bool>(packed: &[u32], out: &mut [f32], t: f32) -> usize {
    let words = (out.len() / 16).min(packed.len());
    let (tv, ntv) = (_mm256_set1_ps(t), _mm256_set1_ps(-t));
    // SAFETY: AVX2 is available (our precondition).
    let (hi_bits, lo_bits) =
        unsafe { ([table(&TWO_BIT_HI[..8]), table(&TWO_BIT_HI[8..])], [table(&TWO_BIT_LO[..8]), table(&TWO_BIT_LO[8..])]) };
    let o = out.as_mut_ptr();
    for (k, &w) in packed[..words].iter().enumerate() {
        let b = _mm256_set1_epi32(w as i32);
        if ADD {
            _mm_prefetch::<_MM_HINT_T0>(o.wrapping_add(16 * k + PREFETCH).cast_const().cast());
        }
        for h in 0..2 {
            // SAFETY: AVX2 is available (our precondition).
            let (hi, lo) = unsafe { (test(b, hi_bits[h]), test(b, lo_bits[h])) };
            // +t where `11`, −t where `10`, +0.0 elsewhere.
            let v = _mm256_or_ps(_mm256_and_ps(_mm256_and_ps(hi, lo), tv), _mm256_and_ps(_mm256_andnot_ps(lo, hi), ntv));
            // SAFETY: `16k + 8h + 8 <= 16·words <= out.len()`.
            unsafe {
                let p = o.add(16 * k + 8 * h);
                _mm256_storeu_ps(p, if ADD { _mm256_add_ps(_mm256_loadu_ps(p), v) } else { v });
            }
        }
    }
    16 * words
}

/// 1-bit quantize of whole words (see `super::quantize1`); returns the elements done.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize1(grad: &[f32], residual: &mut [f32], out: &mut [u32], t: f32) -> usize {
    let words = (grad.len().min(residual.len()) / 32).min(out.len());
    let (tv, one) = (_mm256_set1_ps(t), _mm256_set1_ps(1.0));
    // reverses the 8 lanes: lane j's comparison bit is then bit j of the word's byte
    let rev8 = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    let (g, r) = (grad.as_ptr(), residual.as_mut_ptr());
    for (k, o) in out[..words].iter_mut().enumerate() {
        let mut m = 0u32;
        // two 64-byte lines of each array per word (a prefetch never faults, so addresses
        // past the end are harmless)
        for line in [0, 16] {
            _mm_prefetch::<_MM_HINT_T0>(g.wrapping_add(32 * k + line + PREFETCH).cast());
            _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add(32 * k + line + PREFETCH).cast());
        }
        for q in 0..4 {
            let i = 32 * k + 8 * q;
            // SAFETY: `i + 8 <= 32·words <= len` of both `grad` and `residual`.
            let (gv, rv) = unsafe { (_mm256_loadu_ps(g.add(i)), _mm256_loadu_ps(r.add(i))) };
            let s = _mm256_permutevar8x32_ps(_mm256_add_ps(rv, gv), rev8);
            let pos = _mm256_cmp_ps::<_CMP_GT_OQ>(s, tv);
            // r − 1 where r > t, else r + 1
            let s = _mm256_blendv_ps(_mm256_add_ps(s, one), _mm256_sub_ps(s, one), pos);
            // SAFETY: as for the load.
            unsafe { _mm256_storeu_ps(r.add(i), _mm256_permutevar8x32_ps(s, rev8)) };
            m |= (_mm256_movemask_ps(pos) as u32) << (8 * q);
        }
        *o = m;
    }
    32 * words
}

/// 1-bit dequantize of whole words (see `super::dequantize1`); returns the elements done.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dequantize1<const ADD: bool>(packed: &[u32], out: &mut [f32]) -> usize {
    let words = (out.len() / 32).min(packed.len());
    let (one, minus_one) = (_mm256_set1_ps(1.0), _mm256_set1_ps(-1.0));
    // SAFETY: AVX2 is available (our precondition).
    let bits = unsafe { [table(&ONE_BIT[..8]), table(&ONE_BIT[8..16]), table(&ONE_BIT[16..24]), table(&ONE_BIT[24..])] };
    let o = out.as_mut_ptr();
    for (k, &w) in packed[..words].iter().enumerate() {
        let b = _mm256_set1_epi32(w as i32);
        if ADD {
            for line in [0, 16] {
                _mm_prefetch::<_MM_HINT_T0>(o.wrapping_add(32 * k + line + PREFETCH).cast_const().cast());
            }
        }
        for (q, &bits) in bits.iter().enumerate() {
            // SAFETY: AVX2 is available (our precondition).
            let v = _mm256_blendv_ps(minus_one, one, unsafe { test(b, bits) });
            // SAFETY: `32k + 8q + 8 <= 32·words <= out.len()`.
            unsafe {
                let p = o.add(32 * k + 8 * q);
                _mm256_storeu_ps(p, if ADD { _mm256_add_ps(_mm256_loadu_ps(p), v) } else { v });
            }
        }
    }
    32 * words
}

/// `_mm256_stream_ps`, or under Miri (which cannot run the streaming instruction) the aligned
/// store with the same alignment requirement, so Miri still checks it.
///
/// # Safety
/// The CPU must support AVX2; `p` must be valid for a 32-byte write and 32-byte aligned.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn stream(p: *mut f32, v: __m256) {
    // SAFETY: forwarded from this function's contract.
    #[cfg(not(miri))]
    unsafe {
        _mm256_stream_ps(p, v)
    }
    // SAFETY: forwarded from this function's contract.
    #[cfg(miri)]
    unsafe {
        _mm256_store_ps(p, v)
    }
}

/// The bit table and the next-word selector of an 8-lane layout, as vectors.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn layout(l: &Lanes<8>) -> (__m256i, __m256i) {
    // SAFETY: AVX2 is available (our precondition); the arrays hold 8 `u32`s.
    unsafe { (table(&l.bits), table(&l.next)) }
}

/// 2-bit dequantize `out = value` with non-temporal stores (see `super::dequantize2_stream`);
/// returns the range of elements done.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dequantize2_stream(packed: &[u32], out: &mut [f32], t: f32) -> Range<usize> {
    if packed.len() < out.len().div_ceil(16) {
        return 0..0;
    }
    // Run i covers elements a + 16i .. a + 16i + 16 in two vectors: words i and i + 1 (a < 8).
    let a = head(out, 32);
    let runs = (out.len() - a) / 16;
    // SAFETY: AVX2 is available (our precondition).
    let (hi, lo) = unsafe {
        (
            [layout(&lanes(&TWO_BIT_HI, a)), layout(&lanes(&TWO_BIT_HI, a + 8))],
            [layout(&lanes(&TWO_BIT_LO, a)), layout(&lanes(&TWO_BIT_LO, a + 8))],
        )
    };
    let (tv, ntv) = (_mm256_set1_ps(t), _mm256_set1_ps(-t));
    let o = out.as_mut_ptr();
    for i in 0..runs {
        let w0 = _mm256_set1_epi32(packed[i] as i32);
        let w1 = _mm256_set1_epi32(packed.get(i + 1).map_or(0, |&w| w as i32));
        for v in 0..2 {
            let b = _mm256_blendv_epi8(w0, w1, hi[v].1);
            // SAFETY: AVX2 is available (our precondition).
            let (h, l) = unsafe { (test(b, hi[v].0), test(b, lo[v].0)) };
            let x = _mm256_or_ps(_mm256_and_ps(_mm256_and_ps(h, l), tv), _mm256_and_ps(_mm256_andnot_ps(l, h), ntv));
            // SAFETY: `a + 16i + 8v + 8 <= a + 16·runs <= out.len()`, and `o + a` is on a
            // 32-byte boundary (`head`), so every `o + a + 16i + 8v` is too.
            unsafe { stream(o.add(a + 16 * i + 8 * v), x) };
        }
    }
    fence();
    a..a + 16 * runs
}

/// 1-bit dequantize `out = ±1` with non-temporal stores (see `super::dequantize1_stream`);
/// returns the range of elements done.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dequantize1_stream(packed: &[u32], out: &mut [f32]) -> Range<usize> {
    if packed.len() < out.len().div_ceil(32) {
        return 0..0;
    }
    // Run i covers elements a + 32i .. a + 32i + 32 in four vectors: words i and i + 1 (a < 8).
    let a = head(out, 32);
    let runs = (out.len() - a) / 32;
    // SAFETY: AVX2 is available (our precondition).
    let quarters = unsafe {
        [layout(&lanes(&ONE_BIT, a)), layout(&lanes(&ONE_BIT, a + 8)), layout(&lanes(&ONE_BIT, a + 16)), layout(&lanes(&ONE_BIT, a + 24))]
    };
    let (one, minus_one) = (_mm256_set1_ps(1.0), _mm256_set1_ps(-1.0));
    let o = out.as_mut_ptr();
    for i in 0..runs {
        let w0 = _mm256_set1_epi32(packed[i] as i32);
        let w1 = _mm256_set1_epi32(packed.get(i + 1).map_or(0, |&w| w as i32));
        for (q, &(bits, next)) in quarters.iter().enumerate() {
            // SAFETY: AVX2 is available (our precondition).
            let x = _mm256_blendv_ps(minus_one, one, unsafe { test(_mm256_blendv_epi8(w0, w1, next), bits) });
            // SAFETY: `a + 32i + 8q + 8 <= a + 32·runs <= out.len()`, and `o + a` is on a
            // 32-byte boundary (`head`), so every `o + a + 32i + 8q` is too.
            unsafe { stream(o.add(a + 32 * i + 8 * q), x) };
        }
    }
    fence();
    a..a + 32 * runs
}

//! AVX-512F compression kernels: one 16-lane vector per 2-bit word, two per 1-bit word.
//!
//! Every function is an `unsafe fn` whose one precondition is that the CPU supports AVX-512F
//! and AVX2 (`Isa::detected()` returned `Isa::Avx512`); slice lengths are checked inside, so
//! nothing is read or written out of bounds whatever the arguments.
//!
//! Quantize reverses the lanes of each group of 4 (2-bit, `vpermilps`) or 8 (1-bit,
//! `vpermps`) so that the comparison masks come out in the packed bit order (see `bits.rs`),
//! and reverses them back before storing the residual. Dequantize broadcasts the word and
//! tests one bit per lane (`vptestmd`), so it needs no scalar bit work at all. Loops that read
//! a large array prefetch it a page ahead (`super::PREFETCH`). The streaming dequantize
//! starts at the first 64-byte boundary of the output, so a vector may straddle two
//! words: each lane then picks its word and its bit from a per-call layout (`bits::lanes`).
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::bits::{interleave, lanes, ONE_BIT, TWO_BIT_HI, TWO_BIT_LO};
use super::{fence, head, PREFETCH};

/// `vpermilps` control reversing each group of 4 lanes.
const REVERSE4: i32 = 0b00_01_10_11;

/// 2-bit quantize of whole words (see `super::quantize2`); returns the elements done.
///
/// # Safety
/// The CPU must support AVX-512F and AVX2.
#[target_feature(enable = "avx512f,avx2")]
pub(super) unsafe fn quantize2(grad: &[f32], residual: &mut [f32], out: &mut [u32], t: f32) -> usize {
    let words = (grad.len().min(residual.len()) / 16).min(out.len());
    let (tv, ntv) = (_mm512_set1_ps(t), _mm512_set1_ps(-t));
    let (g, r) = (grad.as_ptr(), residual.as_mut_ptr());
    for (k, o) in out[..words].iter_mut().enumerate() {
        // (a prefetch never faults, so addresses past the end are harmless)
        _mm_prefetch::<_MM_HINT_T0>(g.wrapping_add(16 * k + PREFETCH).cast());
        _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add(16 * k + PREFETCH).cast());
        // SAFETY: `16k + 16 <= 16·words <= len` of both `grad` and `residual`.
        let (gv, rv) = unsafe { (_mm512_loadu_ps(g.add(16 * k)), _mm512_loadu_ps(r.add(16 * k))) };
        let s = _mm512_permute_ps::<REVERSE4>(_mm512_add_ps(rv, gv));
        let pos = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(s, tv);
        // `else if`: a lane that is `>= t` never also counts as `<= −t` (possible when t <= 0).
        let neg = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(s, ntv) & !pos;
        let s = _mm512_mask_add_ps(_mm512_mask_sub_ps(s, pos, s, tv), neg, s, tv);
        // SAFETY: as for the load.
        unsafe { _mm512_storeu_ps(r.add(16 * k), _mm512_permute_ps::<REVERSE4>(s)) };
        *o = interleave(pos | neg, pos);
    }
    16 * words
}

/// 2-bit dequantize of whole words (see `super::dequantize2`); returns the elements done.
///
/// # Safety
/// The CPU must support AVX-512F and AVX2.
#[target_feature(enable = "avx512f,avx2")]
pub(super) unsafe fn dequantize2<const ADD: bool>(packed: &[u32], out: &mut [f32], t: f32) -> usize {
    let words = (out.len() / 16).min(packed.len());
    let (tv, ntv) = (_mm512_set1_ps(t), _mm512_set1_ps(-t));
    // SAFETY: the tables hold 16 `u32`s each (unaligned loads).
    let (hi_bits, lo_bits) = unsafe { (_mm512_loadu_si512(TWO_BIT_HI.as_ptr().cast()), _mm512_loadu_si512(TWO_BIT_LO.as_ptr().cast())) };
    let o = out.as_mut_ptr();
    for (k, &w) in packed[..words].iter().enumerate() {
        let b = _mm512_set1_epi32(w as i32);
        let (hi, lo) = (_mm512_test_epi32_mask(b, hi_bits), _mm512_test_epi32_mask(b, lo_bits));
        // +t where `11`, −t where `10`, +0.0 elsewhere.
        let v = _mm512_mask_mov_ps(_mm512_maskz_mov_ps(hi & !lo, ntv), hi & lo, tv);
        if ADD {
            _mm_prefetch::<_MM_HINT_T0>(o.wrapping_add(16 * k + PREFETCH).cast_const().cast());
        }
        // SAFETY: `16k + 16 <= 16·words <= out.len()`.
        unsafe {
            let p = o.add(16 * k);
            _mm512_storeu_ps(p, if ADD { _mm512_add_ps(_mm512_loadu_ps(p), v) } else { v });
        }
    }
    16 * words
}

/// 1-bit quantize of whole words (see `super::quantize1`); returns the elements done.
///
/// # Safety
/// The CPU must support AVX-512F and AVX2.
#[target_feature(enable = "avx512f,avx2")]
pub(super) unsafe fn quantize1(grad: &[f32], residual: &mut [f32], out: &mut [u32], t: f32) -> usize {
    let words = (grad.len().min(residual.len()) / 32).min(out.len());
    let (tv, one) = (_mm512_set1_ps(t), _mm512_set1_ps(1.0));
    // reverses each group of 8 lanes: lane j's comparison bit is then word bit j
    let rev8 = _mm512_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8);
    let (g, r) = (grad.as_ptr(), residual.as_mut_ptr());
    for (k, o) in out[..words].iter_mut().enumerate() {
        let mut m = 0u32;
        for h in 0..2 {
            let i = 32 * k + 16 * h;
            // (a prefetch never faults, so addresses past the end are harmless)
            _mm_prefetch::<_MM_HINT_T0>(g.wrapping_add(i + PREFETCH).cast());
            _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add(i + PREFETCH).cast());
            // SAFETY: `i + 16 <= 32·words <= len` of both `grad` and `residual`.
            let (gv, rv) = unsafe { (_mm512_loadu_ps(g.add(i)), _mm512_loadu_ps(r.add(i))) };
            let s = _mm512_permutexvar_ps(rev8, _mm512_add_ps(rv, gv));
            let pos = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(s, tv);
            // r − 1 where r > t, else r + 1
            let s = _mm512_mask_blend_ps(pos, _mm512_add_ps(s, one), _mm512_sub_ps(s, one));
            // SAFETY: as for the load.
            unsafe { _mm512_storeu_ps(r.add(i), _mm512_permutexvar_ps(rev8, s)) };
            m |= u32::from(pos) << (16 * h);
        }
        *o = m;
    }
    32 * words
}

/// 1-bit dequantize of whole words (see `super::dequantize1`); returns the elements done.
///
/// # Safety
/// The CPU must support AVX-512F and AVX2.
#[target_feature(enable = "avx512f,avx2")]
pub(super) unsafe fn dequantize1<const ADD: bool>(packed: &[u32], out: &mut [f32]) -> usize {
    let words = (out.len() / 32).min(packed.len());
    let (one, minus_one) = (_mm512_set1_ps(1.0), _mm512_set1_ps(-1.0));
    // SAFETY: the table holds 32 `u32`s (two unaligned loads of 16).
    let bits = unsafe { [_mm512_loadu_si512(ONE_BIT.as_ptr().cast()), _mm512_loadu_si512(ONE_BIT[16..].as_ptr().cast())] };
    let o = out.as_mut_ptr();
    for (k, &w) in packed[..words].iter().enumerate() {
        let b = _mm512_set1_epi32(w as i32);
        for (h, &bits) in bits.iter().enumerate() {
            let v = _mm512_mask_blend_ps(_mm512_test_epi32_mask(b, bits), minus_one, one);
            if ADD {
                _mm_prefetch::<_MM_HINT_T0>(o.wrapping_add(32 * k + 16 * h + PREFETCH).cast_const().cast());
            }
            // SAFETY: `32k + 16h + 16 <= 32·words <= out.len()`.
            unsafe {
                let p = o.add(32 * k + 16 * h);
                _mm512_storeu_ps(p, if ADD { _mm512_add_ps(_mm512_loadu_ps(p), v) } else { v });
            }
        }
    }
    32 * words
}

/// `_mm512_stream_ps`, or under Miri (which cannot run the streaming instruction) the aligned
/// store with the same alignment requirement, so Miri still checks it.
///
/// # Safety
/// The CPU must support AVX-512F; `p` must be valid for a 64-byte write and 64-byte aligned.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
unsafe fn stream(p: *mut f32, v: __m512) {
    // SAFETY: forwarded from this function's contract.
    #[cfg(not(miri))]
    unsafe {
        _mm512_stream_ps(p, v)
    }
    // SAFETY: forwarded from this function's contract.
    #[cfg(miri)]
    unsafe {
        _mm512_store_ps(p, v)
    }
}

/// Loads a 16-lane table.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
unsafe fn load16(t: &[u32; 16]) -> __m512i {
    // SAFETY: 16 `u32`s are readable from `t` (unaligned load).
    unsafe { _mm512_loadu_si512(t.as_ptr().cast()) }
}

/// 2-bit dequantize `out = value` with non-temporal stores (see `super::dequantize2_stream`);
/// returns the range of elements done.
///
/// # Safety
/// The CPU must support AVX-512F and AVX2.
#[target_feature(enable = "avx512f,avx2")]
pub(super) unsafe fn dequantize2_stream(packed: &[u32], out: &mut [f32], t: f32) -> Range<usize> {
    if packed.len() < out.len().div_ceil(16) {
        return 0..0;
    }
    // Vector i covers elements a + 16i .. a + 16i + 16: words i and (for lanes past the
    // word's end) i + 1, since a < 16.
    let a = head(out, 64);
    let runs = (out.len() - a) / 16;
    let (hi, lo) = (lanes::<16>(&TWO_BIT_HI, a), lanes::<16>(&TWO_BIT_LO, a));
    // SAFETY: AVX-512F is available (our precondition).
    let (hi_bits, lo_bits) = unsafe { (load16(&hi.bits), load16(&lo.bits)) };
    let next = hi.next_mask as u16;
    let (tv, ntv) = (_mm512_set1_ps(t), _mm512_set1_ps(-t));
    let o = out.as_mut_ptr();
    for i in 0..runs {
        let w0 = _mm512_set1_epi32(packed[i] as i32);
        let w1 = _mm512_set1_epi32(packed.get(i + 1).map_or(0, |&w| w as i32));
        let b = _mm512_mask_blend_epi32(next, w0, w1);
        let (h, l) = (_mm512_test_epi32_mask(b, hi_bits), _mm512_test_epi32_mask(b, lo_bits));
        let v = _mm512_mask_mov_ps(_mm512_maskz_mov_ps(h & !l, ntv), h & l, tv);
        // SAFETY: `a + 16i + 16 <= a + 16·runs <= out.len()`, and `o + a` is on a 64-byte
        // boundary (`head`), so every `o + a + 16i` is too.
        unsafe { stream(o.add(a + 16 * i), v) };
    }
    fence();
    a..a + 16 * runs
}

/// 1-bit dequantize `out = ±1` with non-temporal stores (see `super::dequantize1_stream`);
/// returns the range of elements done.
///
/// # Safety
/// The CPU must support AVX-512F and AVX2.
#[target_feature(enable = "avx512f,avx2")]
pub(super) unsafe fn dequantize1_stream(packed: &[u32], out: &mut [f32]) -> Range<usize> {
    if packed.len() < out.len().div_ceil(32) {
        return 0..0;
    }
    // Run i covers elements a + 32i .. a + 32i + 32 in two vectors: words i and i + 1.
    let a = head(out, 64);
    let runs = (out.len() - a) / 32;
    let layout = [lanes::<16>(&ONE_BIT, a), lanes::<16>(&ONE_BIT, a + 16)];
    // SAFETY: AVX-512F is available (our precondition).
    let bits = unsafe { [load16(&layout[0].bits), load16(&layout[1].bits)] };
    let (one, minus_one) = (_mm512_set1_ps(1.0), _mm512_set1_ps(-1.0));
    let o = out.as_mut_ptr();
    for i in 0..runs {
        let w0 = _mm512_set1_epi32(packed[i] as i32);
        let w1 = _mm512_set1_epi32(packed.get(i + 1).map_or(0, |&w| w as i32));
        for v in 0..2 {
            let b = _mm512_mask_blend_epi32(layout[v].next_mask as u16, w0, w1);
            let x = _mm512_mask_blend_ps(_mm512_test_epi32_mask(b, bits[v]), minus_one, one);
            // SAFETY: `a + 32i + 16v + 16 <= a + 32·runs <= out.len()`, and `o + a` is on a
            // 64-byte boundary (`head`), so every `o + a + 32i + 16v` is too.
            unsafe { stream(o.add(a + 32 * i + 16 * v), x) };
        }
    }
    fence();
    a..a + 32 * runs
}

//! Splitting one (de)quantize call across rayon's threads.
//!
//! Below a size bound (or on a one-thread pool) the calling thread does the whole call: no
//! rayon, no allocation. Above it, the elements are cut into pieces of whole 4 KiB pages of
//! f32 (1024 elements: a multiple of both 16 and 32, so every piece but the last is whole
//! words and no two pieces share a packed word or a cache line) and the pieces run on the
//! current rayon pool. Pieces are independent, so results do not depend on the split or the
//! thread count.

use rayon::prelude::*;

/// Elements from which a quantize is split across threads. Waking rayon's pool costs about
/// 10 µs; one core quantizes 512 Ki cache-resident elements in about 70 µs (2-bit, AVX-512,
/// on the development host), so two threads win from there.
pub(super) const QUANTIZE_PARALLEL_MIN_LEN: usize = 512 * 1024;

/// Elements from which a dequantize is split across threads: it does less work per element
/// (about 20 µs per 512 Ki cache-resident elements on one core), so it waits for 1 Mi.
pub(super) const DEQUANTIZE_PARALLEL_MIN_LEN: usize = 1024 * 1024;

/// Pieces per thread: a few, so a thread that finishes early can steal.
const PIECES_PER_THREAD: usize = 4;

/// Piece length in elements: whole pages of f32, about `n / (threads · PIECES_PER_THREAD)`.
fn piece_len(n: usize, threads: usize) -> usize {
    const GRAIN: usize = 1024;
    n.div_ceil(threads * PIECES_PER_THREAD).max(1).div_ceil(GRAIN) * GRAIN
}

/// The pool size if a call of `n` elements should be split (from `min_len`), else `None`.
fn split(n: usize, min_len: usize) -> Option<usize> {
    if n < min_len {
        return None;
    }
    Some(rayon::current_num_threads()).filter(|&t| t >= 2)
}

/// Runs `f(grad, residual, out)` over matching pieces (`per_word` elements per packed word).
/// The lengths must already agree: `residual.len() == grad.len()`,
/// `out.len() == grad.len().div_ceil(per_word)`.
pub(super) fn quantize_pieces(
    per_word: usize,
    grad: &[f32],
    residual: &mut [f32],
    out: &mut [u32],
    f: impl Fn(&[f32], &mut [f32], &mut [u32]) + Sync,
) {
    let Some(threads) = split(grad.len(), QUANTIZE_PARALLEL_MIN_LEN) else { return f(grad, residual, out) };
    let piece = piece_len(grad.len(), threads);
    grad.par_chunks(piece).zip(residual.par_chunks_mut(piece)).zip(out.par_chunks_mut(piece / per_word)).for_each(|((g, r), o)| f(g, r, o));
}

/// Runs `f(packed, out)` over matching pieces (`per_word` elements per packed word). The
/// lengths must already agree: `packed.len() == out.len().div_ceil(per_word)`.
pub(super) fn dequantize_pieces(per_word: usize, packed: &[u32], out: &mut [f32], f: impl Fn(&[u32], &mut [f32]) + Sync) {
    let Some(threads) = split(out.len(), DEQUANTIZE_PARALLEL_MIN_LEN) else { return f(packed, out) };
    let piece = piece_len(out.len(), threads);
    packed.par_chunks(piece / per_word).zip(out.par_chunks_mut(piece)).for_each(|(p, o)| f(p, o));
}

#[cfg(test)]
mod tests {
    use super::piece_len;

    #[test]
    fn pieces_are_whole_pages_and_cover() {
        for n in [1, 1023, 512 * 1024 + 1, 3_000_001, 16 << 20] {
            let p = piece_len(n, 2);
            assert_eq!(p % 1024, 0);
            assert!(p * 8 >= n);
        }
    }
}

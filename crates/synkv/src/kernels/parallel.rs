//! Splitting one kernel call across rayon's threads.
//!
//! Only the destination is split; each piece gets its offset so the kernel can find the
//! matching part of its sources. Below `Plan::parallel_min_len` elements (or with a one-thread
//! pool) the kernel runs on the calling thread: no rayon, no allocation. Pieces are whole
//! 4 KiB pages of the destination, so two threads never write the same cache line and
//! streaming stores see line-aligned pieces when the destination is.

use rayon::prelude::*;

use super::tuning::Plan;

/// Pieces per thread: a few, so a thread that finishes early can steal, but large enough
/// that per-piece overhead vanishes against memory time.
const PIECES_PER_THREAD: usize = 4;

/// Runs `f(piece, offset)` over `dst`, in parallel when the plan says so.
#[inline]
pub(crate) fn for_chunks<T: Send>(plan: &Plan, dst: &mut [T], f: impl Fn(&mut [T], usize) + Sync) {
    let n = dst.len();
    if n < plan.parallel_min_len {
        return f(dst, 0);
    }
    let threads = rayon::current_num_threads();
    if threads < 2 {
        return f(dst, 0);
    }
    let chunk = chunk_len(n, threads, std::mem::size_of::<T>());
    dst.par_chunks_mut(chunk).enumerate().for_each(|(i, piece)| f(piece, i * chunk));
}

/// Piece length in elements: about `n / (threads · PIECES_PER_THREAD)`, rounded up to whole
/// 4 KiB pages.
fn chunk_len(n: usize, threads: usize, size: usize) -> usize {
    let grain = (4096 / size.max(1)).max(1);
    let per = n.div_ceil(threads * PIECES_PER_THREAD).max(1);
    per.div_ceil(grain) * grain
}

#[cfg(test)]
mod tests {
    use super::chunk_len;

    #[test]
    fn pieces_are_whole_pages_and_cover() {
        for n in [1, 4095, 65_536, 3_000_001, 16 << 20] {
            let c = chunk_len(n, 2, 4);
            assert_eq!(c % 1024, 0);
            assert!(c * 8 >= n);
        }
    }
}

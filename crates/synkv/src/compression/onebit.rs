//! 1-bit compression (spec K7.7, MXNet 2.0): 32 values per 32-bit word, each `+1` or `−1`,
//! with the quantization error kept in a residual and added to the next gradient.
//!
//! For each element, with threshold `t` and residual `r` (zero before the first push):
//!
//! | after `r += g` | bit | residual | dequantized |
//! |----------------|-----|----------|-------------|
//! | `r > t`        | `1` | `r − 1`  | `+1`        |
//! | else           | `0` | `r + 1`  | `−1`        |
//!
//! The comparison is strict and made in f32; NaN compares false (bit 0). The threshold only
//! decides the sign: the values are ±1 whatever its magnitude (spec K12.3), so
//! [`dequantize`] takes no threshold. Element `i` lives in byte `i/8` of the packed buffer
//! (word `i/32`) at bit `7 − i%8`; the buffer's words are little-endian (`u32::to_le_bytes`
//! gives the wire bytes); unused trailing bits are 0.
//!
//! The functions pick the best vector path for the CPU (AVX-512F, AVX2, else the scalar
//! reference; identical bits on every path), split large arrays (quantize from 512 Ki
//! elements, dequantize from 1 Mi) across rayon's threads, and [`dequantize`] into 8 MiB or
//! more with non-temporal stores.

use super::error::{check_len, Result};
use super::parallel::{dequantize_pieces, quantize_pieces};
use super::simd::{self, Isa};

/// Elements per packed word.
pub const FACTOR: usize = 32;

/// 32-bit words holding `n` 1-bit values: `ceil(n / 32)`.
pub fn compressed_len(n: usize) -> usize {
    n.div_ceil(FACTOR)
}

/// Quantizes `grad` into `out` with threshold `t`, updating `residual` in place.
///
/// `residual` must have `grad.len()` elements and `out` exactly
/// [`compressed_len`]`(grad.len())` words; every word of `out` is overwritten.
///
/// # Errors
/// [`Error::LengthMismatch`](super::Error::LengthMismatch) if a length is wrong (nothing is
/// written then).
pub fn quantize(grad: &[f32], residual: &mut [f32], out: &mut [u32], threshold: f32) -> Result<()> {
    check_len("onebit::quantize", "the residual", grad.len(), residual.len())?;
    check_len("onebit::quantize", "the packed output", compressed_len(grad.len()), out.len())?;
    quantize_with(Isa::detected(), grad, residual, out, threshold);
    Ok(())
}

/// Writes the `n` values packed in `packed` into `out` (`+1` or `−1`).
///
/// `n` is the element count (from the array's shape, or on a server from the request); `out`
/// must have `n` elements and `packed` exactly [`compressed_len`]`(n)` words.
///
/// # Errors
/// [`Error::LengthMismatch`](super::Error::LengthMismatch) if a length is wrong.
pub fn dequantize(packed: &[u32], n: usize, out: &mut [f32]) -> Result<()> {
    check_dequantize("onebit::dequantize", packed, n, out.len())?;
    dequantize_with::<false>(Isa::detected(), packed, out, streams(n));
    Ok(())
}

/// Adds the `n` values packed in `packed` to `acc` (`acc[i] += ±1`): a server summing several
/// pushes saves a pass over memory. The result is bit-identical to [`dequantize`] into a
/// scratch buffer followed by `acc[i] += scratch[i]`.
///
/// # Errors
/// [`Error::LengthMismatch`](super::Error::LengthMismatch) if a length is wrong.
pub fn dequantize_add(packed: &[u32], n: usize, acc: &mut [f32]) -> Result<()> {
    check_dequantize("onebit::dequantize_add", packed, n, acc.len())?;
    dequantize_with::<true>(Isa::detected(), packed, acc, false);
    Ok(())
}

fn check_dequantize(op: &'static str, packed: &[u32], n: usize, out: usize) -> Result<()> {
    check_len(op, "the output", n, out)?;
    check_len(op, "the packed input", compressed_len(n), packed.len())
}

/// [`quantize`] at a given level, lengths already checked.
pub(crate) fn quantize_with(isa: Isa, grad: &[f32], residual: &mut [f32], out: &mut [u32], t: f32) {
    quantize_pieces(FACTOR, grad, residual, out, |g, r, o| {
        let done = simd::quantize1(isa, g, r, o, t);
        quantize_scalar(&g[done..], &mut r[done..], &mut o[done / FACTOR..], t);
    });
}

/// Whether a dequantize of `n` elements writes with non-temporal stores.
fn streams(n: usize) -> bool {
    n.saturating_mul(4) >= simd::STREAM_MIN_BYTES
}

/// [`dequantize`] (or with `ADD`, [`dequantize_add`]) at a given level, lengths already
/// checked; `stream` (ignored with `ADD`) writes with non-temporal stores where it can.
pub(crate) fn dequantize_with<const ADD: bool>(isa: Isa, packed: &[u32], out: &mut [f32], stream: bool) {
    dequantize_pieces(FACTOR, packed, out, |p, o| {
        if stream && !ADD {
            let done = simd::dequantize1_stream(isa, p, o);
            let (head, rest) = o.split_at_mut(done.start);
            dequantize_scalar::<false>(p, head, 0);
            dequantize_scalar::<false>(p, &mut rest[done.len()..], done.end);
        } else {
            let done = simd::dequantize1::<ADD>(isa, p, o);
            dequantize_scalar::<ADD>(p, &mut o[done..], done);
        }
    });
}

/// Bit position of element `j` in its word (`j < 32`): byte `j/8`, bit `7 − j%8`.
#[inline(always)]
fn shift(j: usize) -> u32 {
    (8 * (j / 8) + 7 - j % 8) as u32
}

/// The reference: element by element, exactly the table in the module doc.
pub(crate) fn quantize_scalar(grad: &[f32], residual: &mut [f32], out: &mut [u32], t: f32) {
    for ((g, r), o) in grad.chunks(FACTOR).zip(residual.chunks_mut(FACTOR)).zip(out.iter_mut()) {
        let mut word = 0u32;
        for (j, (&g, r)) in g.iter().zip(r.iter_mut()).enumerate() {
            let sum = *r + g;
            // (written as selects, so the compiler need not branch on random data)
            let (bit, left) = if sum > t { (1, sum - 1.0) } else { (0, sum + 1.0) };
            *r = left;
            word |= bit << shift(j);
        }
        *o = word;
    }
}

/// The reference dequantize (`ADD`: `out += value`, else `out = value`) of the elements
/// `first..first + out.len()`.
pub(crate) fn dequantize_scalar<const ADD: bool>(packed: &[u32], out: &mut [f32], first: usize) {
    let put = |o: &mut f32, word: u32, j: usize| {
        let v = if (word >> shift(j)) & 1 == 1 { 1.0 } else { -1.0 };
        if ADD {
            *o += v;
        } else {
            *o = v;
        }
    };
    // elements up to the next word boundary, then word by word
    let head = ((FACTOR - first % FACTOR) % FACTOR).min(out.len());
    let (head_out, rest) = out.split_at_mut(head);
    for (e, o) in (first..).zip(head_out) {
        put(o, packed[e / FACTOR], e % FACTOR);
    }
    for (&word, chunk) in packed[(first + head) / FACTOR..].iter().zip(rest.chunks_mut(FACTOR)) {
        for (j, o) in chunk.iter_mut().enumerate() {
            put(o, word, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::compression::tests::{bits, sample};

    /// K7.7's vector, on every level and through the public entry point.
    #[test]
    fn k7_7_test_vector() {
        let g = [0.3f32, -0.2, 0.0, 2.0];
        let want_r = [0.3f32 - 1.0, -0.2 + 1.0, 1.0, 1.0];
        for isa in Isa::available() {
            let mut r = [0.0f32; 4];
            let mut out = [0xffff_ffffu32; 1];
            quantize_with(isa, &g, &mut r, &mut out, 0.0);
            assert_eq!(out[0].to_le_bytes(), [0x90, 0, 0, 0], "{isa:?}");
            assert_eq!(r, want_r, "{isa:?}");
            let mut d = [9.0f32; 4];
            dequantize_with::<false>(isa, &out, &mut d, false);
            assert_eq!(d, [1.0, -1.0, -1.0, 1.0], "{isa:?}");
        }
        let mut r = [0.0f32; 4];
        let mut out = [0u32; 1];
        quantize(&g, &mut r, &mut out, 0.0).unwrap();
        assert_eq!(out[0].to_le_bytes()[0], 0x90);
        for (got, want) in r.iter().zip([-0.7f32, 0.8, 1.0, 1.0]) {
            assert!((got - want).abs() < 1e-6, "{r:?}");
        }
        let mut d = [0.0f32; 4];
        dequantize(&out, 4, &mut d).unwrap();
        assert_eq!(d, [1.0, -1.0, -1.0, 1.0]);
        let mut acc = [0.5f32; 4];
        dequantize_add(&out, 4, &mut acc).unwrap();
        assert_eq!(acc, [1.5, -0.5, -0.5, 1.5]);
    }

    #[test]
    fn comparison_is_strict_and_threshold_only_picks_the_sign() {
        // r == t gives bit 0 (−1); t far from ±1 still dequantizes to ±1
        for t in [-0.5f32, 0.0, 0.5, 3.0] {
            let mut r = [0.0f32; 2];
            let mut out = [0u32];
            quantize(&[t, t + 1.0], &mut r, &mut out, t).unwrap();
            assert_eq!(out[0], 0x40, "t={t}");
            assert_eq!(r, [t + 1.0, t], "t={t}");
            let mut d = [0.0f32; 2];
            dequantize(&out, 2, &mut d).unwrap();
            assert_eq!(d, [-1.0, 1.0]);
        }
    }

    #[test]
    fn lengths_are_checked() {
        assert!(quantize(&[0.0; 33], &mut [0.0; 33], &mut [0; 1], 0.0).is_err());
        assert!(quantize(&[0.0; 33], &mut [0.0; 32], &mut [0; 2], 0.0).is_err());
        assert!(dequantize(&[0; 1], 33, &mut [0.0; 33]).is_err());
        assert!(dequantize_add(&[0; 2], 33, &mut [0.0; 32]).is_err());
        quantize(&[0.0; 33], &mut [0.0; 33], &mut [0; 2], 0.0).unwrap();
    }

    #[test]
    fn trailing_bits_are_zero() {
        for n in 1..32 {
            let mut out = [0xffff_ffffu32];
            quantize(&vec![1.0f32; n], &mut vec![0.0; n], &mut out, 0.0).unwrap();
            let want = (0..n).fold(0u32, |w, j| w | 1 << shift(j));
            assert_eq!(out[0], want, "n={n}");
        }
    }

    /// Large enough to take the threaded path, with a tail; every piece must give the
    /// reference's bits.
    #[test]
    fn threaded_path_matches_scalar() {
        let n = super::super::parallel::DEQUANTIZE_PARALLEL_MIN_LEN + 45;
        let g: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let mut r1 = vec![0.1f32; n];
        let mut r2 = r1.clone();
        let (mut o1, mut o2) = (vec![0u32; compressed_len(n)], vec![0u32; compressed_len(n)]);
        // a pool of 4 threads, so the split happens whatever the machine
        let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
        pool.install(|| quantize(&g, &mut r1, &mut o1, 0.0)).unwrap();
        quantize_scalar(&g, &mut r2, &mut o2, 0.0);
        assert_eq!(o1, o2);
        assert!(r1.iter().zip(&r2).all(|(a, b)| a.to_bits() == b.to_bits()));
        let (mut d1, mut d2) = (vec![1.0f32; n], vec![1.0f32; n]);
        pool.install(|| dequantize_add(&o1, n, &mut d1)).unwrap();
        dequantize_scalar::<true>(&o2, &mut d2, 0);
        assert!(d1.iter().zip(&d2).all(|(a, b)| a.to_bits() == b.to_bits()));
        // streaming, into a misaligned output
        let mut d3 = vec![0.0f32; n + 1];
        pool.install(|| dequantize_with::<false>(Isa::detected(), &o1, &mut d3[1..], true));
        dequantize_scalar::<false>(&o2, &mut d2, 0);
        assert!(d3[1..].iter().zip(&d2).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Every vector level gives the scalar reference's bits: words, residuals, and both
        /// dequantize forms, for any length (tails included) and threshold.
        #[test]
        fn simd_matches_scalar(
            n in 0usize..5000,
            seed: u64,
            t in prop_oneof![4 => -1.0f32..1.0, 1 => Just(0.0f32), 1 => Just(-0.5f32), 1 => proptest::num::f32::ANY],
        ) {
            let (g, r0, acc0) = (sample(n, seed), sample(n, seed ^ 1), sample(n, seed ^ 2));
            let mut want_r = r0.clone();
            let mut want_o = vec![0u32; compressed_len(n)];
            quantize_scalar(&g, &mut want_r, &mut want_o, t);
            let mut want_d = vec![0.0f32; n];
            dequantize_scalar::<false>(&want_o, &mut want_d, 0);
            let mut want_a = acc0.clone();
            dequantize_scalar::<true>(&want_o, &mut want_a, 0);
            for isa in Isa::available() {
                let mut r = r0.clone();
                let mut o = vec![0xdead_beefu32; compressed_len(n)];
                quantize_with(isa, &g, &mut r, &mut o, t);
                prop_assert_eq!(&o, &want_o, "{:?}", isa);
                prop_assert_eq!(bits(&r), bits(&want_r), "{:?}", isa);
                let mut d = vec![f32::NAN; n];
                dequantize_with::<false>(isa, &o, &mut d, false);
                prop_assert_eq!(bits(&d), bits(&want_d), "{:?}", isa);
                // the streaming form, at every alignment of the output
                let mut buf = vec![f32::NAN; n + 16];
                for off in 0..16 {
                    let d = &mut buf[off..off + n];
                    dequantize_with::<false>(isa, &o, d, true);
                    prop_assert_eq!(bits(d), bits(&want_d), "{:?} stream, offset {}", isa, off);
                }
                let mut a = acc0.clone();
                dequantize_with::<true>(isa, &o, &mut a, false);
                prop_assert_eq!(bits(&a), bits(&want_a), "{:?}", isa);
            }
        }
    }
}

//! 2-bit compression (spec K7.4–K7.6): 16 values per 32-bit word, each `+t`, `−t` or `0`,
//! with the quantization error kept in a residual and added to the next gradient.
//!
//! For each element, with threshold `t` and residual `r` (zero before the first push):
//!
//! | after `r += g` | code | residual | dequantized |
//! |----------------|------|----------|-------------|
//! | `r >= t`       | `11` | `r − t`  | `+t`        |
//! | else `r <= −t` | `10` | `r + t`  | `−t`        |
//! | else           | `00` | `r`      | `0`         |
//!
//! Comparisons are inclusive and are made in f32; NaN compares false (code `00`). Codes `01`
//! (never produced) dequantize to 0. Element `i` lives in byte `i/4` of the packed buffer
//! (word `i/16`), the first of each byte's four elements in bits 7–6; the buffer's words are
//! little-endian (`u32::to_le_bytes` gives the wire bytes); unused trailing bits are 0.
//!
//! The functions pick the best vector path for the CPU (AVX-512F, AVX2, else the scalar
//! reference; identical bits on every path), split large arrays (quantize from 512 Ki
//! elements, dequantize from 1 Mi) across rayon's threads, and [`dequantize`] into 8 MiB or
//! more with non-temporal stores.

use super::error::{check_len, Result};
use super::parallel::{dequantize_pieces, quantize_pieces};
use super::simd::{self, Isa};

/// Elements per packed word.
pub const FACTOR: usize = 16;

/// 32-bit words holding `n` 2-bit values: `ceil(n / 16)`.
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
    check_len("twobit::quantize", "the residual", grad.len(), residual.len())?;
    check_len("twobit::quantize", "the packed output", compressed_len(grad.len()), out.len())?;
    quantize_with(Isa::detected(), grad, residual, out, threshold);
    Ok(())
}

/// Writes the `n` values packed in `packed` into `out` (`+t`, `−t` or `0`).
///
/// `n` is the element count (from the array's shape, or on a server from the request); `out`
/// must have `n` elements and `packed` exactly [`compressed_len`]`(n)` words.
///
/// # Errors
/// [`Error::LengthMismatch`](super::Error::LengthMismatch) if a length is wrong.
pub fn dequantize(packed: &[u32], n: usize, threshold: f32, out: &mut [f32]) -> Result<()> {
    check_dequantize("twobit::dequantize", packed, n, out.len())?;
    dequantize_with::<false>(Isa::detected(), packed, out, threshold, streams(n));
    Ok(())
}

/// Adds the `n` values packed in `packed` to `acc` (`acc[i] += value`, also when the value is
/// 0): a server summing several pushes saves a pass over memory. The result is bit-identical
/// to [`dequantize`] into a scratch buffer followed by `acc[i] += scratch[i]`.
///
/// # Errors
/// [`Error::LengthMismatch`](super::Error::LengthMismatch) if a length is wrong.
pub fn dequantize_add(packed: &[u32], n: usize, threshold: f32, acc: &mut [f32]) -> Result<()> {
    check_dequantize("twobit::dequantize_add", packed, n, acc.len())?;
    dequantize_with::<true>(Isa::detected(), packed, acc, threshold, false);
    Ok(())
}

fn check_dequantize(op: &'static str, packed: &[u32], n: usize, out: usize) -> Result<()> {
    check_len(op, "the output", n, out)?;
    check_len(op, "the packed input", compressed_len(n), packed.len())
}

/// [`quantize`] at a given level, lengths already checked.
pub(crate) fn quantize_with(isa: Isa, grad: &[f32], residual: &mut [f32], out: &mut [u32], t: f32) {
    quantize_pieces(FACTOR, grad, residual, out, |g, r, o| {
        let done = simd::quantize2(isa, g, r, o, t);
        quantize_scalar(&g[done..], &mut r[done..], &mut o[done / FACTOR..], t);
    });
}

/// Whether a dequantize of `n` elements writes with non-temporal stores.
fn streams(n: usize) -> bool {
    n.saturating_mul(4) >= simd::STREAM_MIN_BYTES
}

/// [`dequantize`] (or with `ADD`, [`dequantize_add`]) at a given level, lengths already
/// checked; `stream` (ignored with `ADD`) writes with non-temporal stores where it can.
pub(crate) fn dequantize_with<const ADD: bool>(isa: Isa, packed: &[u32], out: &mut [f32], t: f32, stream: bool) {
    dequantize_pieces(FACTOR, packed, out, |p, o| {
        if stream && !ADD {
            let done = simd::dequantize2_stream(isa, p, o, t);
            let (head, rest) = o.split_at_mut(done.start);
            dequantize_scalar::<false>(p, head, 0, t);
            dequantize_scalar::<false>(p, &mut rest[done.len()..], done.end, t);
        } else {
            let done = simd::dequantize2::<ADD>(isa, p, o, t);
            dequantize_scalar::<ADD>(p, &mut o[done..], done, t);
        }
    });
}

/// Bit position of the low bit of element `j`'s code in its word (`j < 16`): byte `j/4`,
/// bits 7–6, 5–4, 3–2, 1–0 for `j%4` = 0, 1, 2, 3.
#[inline(always)]
fn shift(j: usize) -> u32 {
    (8 * (j / 4) + 6 - 2 * (j % 4)) as u32
}

/// The reference: element by element, exactly the table in the module doc.
pub(crate) fn quantize_scalar(grad: &[f32], residual: &mut [f32], out: &mut [u32], t: f32) {
    for ((g, r), o) in grad.chunks(FACTOR).zip(residual.chunks_mut(FACTOR)).zip(out.iter_mut()) {
        let mut word = 0u32;
        for (j, (&g, r)) in g.iter().zip(r.iter_mut()).enumerate() {
            let sum = *r + g;
            // (written as selects, so the compiler need not branch on random data)
            let (code, left) = if sum >= t {
                (0b11, sum - t)
            } else if sum <= -t {
                (0b10, sum + t)
            } else {
                (0b00, sum)
            };
            *r = left;
            word |= code << shift(j);
        }
        *o = word;
    }
}

/// The reference dequantize (`ADD`: `out += value`, else `out = value`) of the elements
/// `first..first + out.len()`.
pub(crate) fn dequantize_scalar<const ADD: bool>(packed: &[u32], out: &mut [f32], first: usize, t: f32) {
    // indexed by the code: `00` and `01` → 0, `10` → −t, `11` → +t
    let value = [0.0, 0.0, -t, t];
    let put = |o: &mut f32, word: u32, j: usize| {
        let v = value[((word >> shift(j)) & 0b11) as usize];
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
    use crate::compression::Error;

    fn to_bytes(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// K7.6's vector, on every level and through the public entry point.
    #[test]
    fn k7_6_test_vector() {
        let g = [0.6f32, -0.7, 0.2, 0.5, -0.5, 0.0, 1.2, -0.49];
        // residuals computed in f32, as the spec says ("float32-rounded")
        let want_r = [0.6f32 - 0.5, -0.7 + 0.5, 0.2, 0.0, 0.0, 0.0, 1.2 - 0.5, -0.49];
        let want_d = [0.5f32, -0.5, 0.0, 0.5, -0.5, 0.0, 0.5, 0.0];
        for isa in Isa::available() {
            let mut r = [0.0f32; 8];
            let mut out = [0xffff_ffffu32; 1];
            quantize_with(isa, &g, &mut r, &mut out, 0.5);
            assert_eq!(to_bytes(&out), [0xe3, 0x8c, 0x00, 0x00], "{isa:?}");
            assert_eq!(out[0], 0x0000_8ce3);
            assert_eq!(r, want_r, "{isa:?}");
            let mut d = [9.0f32; 8];
            dequantize_with::<false>(isa, &out, &mut d, 0.5, false);
            assert_eq!(d, want_d, "{isa:?}");
        }
        let mut r = [0.0f32; 8];
        let mut out = [0u32; 1];
        quantize(&g, &mut r, &mut out, 0.5).unwrap();
        assert_eq!(to_bytes(&out), [0xe3, 0x8c, 0x00, 0x00]);
        for (got, want) in r.iter().zip([0.1f32, -0.2, 0.2, 0.0, 0.0, 0.0, 0.7, -0.49]) {
            assert!((got - want).abs() < 1e-6, "{r:?}");
        }
        let mut d = [0.0f32; 8];
        dequantize(&out, 8, 0.5, &mut d).unwrap();
        assert_eq!(d, want_d);
        let mut acc = [1.0f32; 8];
        dequantize_add(&out, 8, 0.5, &mut acc).unwrap();
        assert_eq!(acc, want_d.map(|v| 1.0 + v));
    }

    #[test]
    fn lengths_are_checked() {
        let mut r = [0.0f32; 17];
        let mut out = [0u32; 1];
        let err = quantize(&[0.0; 17], &mut r, &mut out, 0.5).unwrap_err();
        assert_eq!(err, Error::LengthMismatch { op: "twobit::quantize", what: "the packed output", expected: 2, got: 1 });
        assert!(quantize(&[0.0; 17], &mut r[..16], &mut [0; 2], 0.5).is_err());
        assert!(dequantize(&[0; 1], 17, 0.5, &mut [0.0; 17]).is_err());
        assert!(dequantize(&[0; 2], 17, 0.5, &mut [0.0; 16]).is_err());
        assert!(dequantize_add(&[0; 2], 17, 0.5, &mut [0.0; 18]).is_err());
        quantize(&[], &mut [], &mut [], 0.5).unwrap();
        dequantize(&[], 0, 0.5, &mut []).unwrap();
    }

    #[test]
    fn trailing_bits_are_zero_and_ignored() {
        for n in 1..16 {
            let g = vec![1.0f32; n];
            let mut out = [0xffff_ffffu32];
            quantize(&g, &mut vec![0.0; n], &mut out, 0.5).unwrap();
            let mut want = 0u32;
            for j in 0..n {
                want |= 0b11 << shift(j);
            }
            assert_eq!(out[0], want, "n={n}");
            // garbage in the unused bits does not matter
            let mut d = vec![0.0f32; n];
            dequantize(&[want | !want], n, 0.5, &mut d).unwrap();
            assert!(d.iter().all(|&v| v == 0.5));
        }
    }

    #[test]
    fn code_01_dequantizes_to_zero() {
        let mut d = [7.0f32; 16];
        dequantize(&[0x5555_5555], 16, 0.5, &mut d).unwrap();
        assert_eq!(d, [0.0; 16]);
    }

    /// Large enough to take the threaded path, with a tail; every piece must give the
    /// reference's bits.
    #[test]
    fn threaded_path_matches_scalar() {
        let n = super::super::parallel::DEQUANTIZE_PARALLEL_MIN_LEN + 37;
        let g: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let mut r1 = vec![0.1f32; n];
        let mut r2 = r1.clone();
        let (mut o1, mut o2) = (vec![0u32; compressed_len(n)], vec![0u32; compressed_len(n)]);
        // a pool of 4 threads, so the split happens whatever the machine
        let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
        pool.install(|| quantize(&g, &mut r1, &mut o1, 0.3)).unwrap();
        quantize_scalar(&g, &mut r2, &mut o2, 0.3);
        assert_eq!(o1, o2);
        assert!(r1.iter().zip(&r2).all(|(a, b)| a.to_bits() == b.to_bits()));
        let (mut d1, mut d2) = (vec![1.0f32; n], vec![1.0f32; n]);
        pool.install(|| dequantize_add(&o1, n, 0.3, &mut d1)).unwrap();
        dequantize_scalar::<true>(&o2, &mut d2, 0, 0.3);
        assert!(d1.iter().zip(&d2).all(|(a, b)| a.to_bits() == b.to_bits()));
        // streaming, into a misaligned output
        let mut d3 = vec![0.0f32; n + 1];
        pool.install(|| dequantize_with::<false>(Isa::detected(), &o1, &mut d3[1..], 0.3, true));
        dequantize_scalar::<false>(&o2, &mut d2, 0, 0.3);
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
            t in prop_oneof![4 => 0.01f32..2.0, 1 => Just(0.5f32), 1 => -1.0f32..0.0, 1 => Just(0.0f32), 1 => proptest::num::f32::ANY],
        ) {
            let (g, r0, acc0) = (sample(n, seed), sample(n, seed ^ 1), sample(n, seed ^ 2));
            let mut want_r = r0.clone();
            let mut want_o = vec![0u32; compressed_len(n)];
            quantize_scalar(&g, &mut want_r, &mut want_o, t);
            let mut want_d = vec![0.0f32; n];
            dequantize_scalar::<false>(&want_o, &mut want_d, 0, t);
            let mut want_a = acc0.clone();
            dequantize_scalar::<true>(&want_o, &mut want_a, 0, t);
            for isa in Isa::available() {
                let mut r = r0.clone();
                let mut o = vec![0xdead_beefu32; compressed_len(n)];
                quantize_with(isa, &g, &mut r, &mut o, t);
                prop_assert_eq!(&o, &want_o, "{:?}", isa);
                prop_assert_eq!(bits(&r), bits(&want_r), "{:?}", isa);
                let mut d = vec![f32::NAN; n];
                dequantize_with::<false>(isa, &o, &mut d, t, false);
                prop_assert_eq!(bits(&d), bits(&want_d), "{:?}", isa);
                // the streaming form, at every alignment of the output
                let mut buf = vec![f32::NAN; n + 16];
                for off in 0..16 {
                    let d = &mut buf[off..off + n];
                    dequantize_with::<false>(isa, &o, d, t, true);
                    prop_assert_eq!(bits(d), bits(&want_d), "{:?} stream, offset {}", isa, off);
                }
                let mut a = acc0.clone();
                dequantize_with::<true>(isa, &o, &mut a, t, false);
                prop_assert_eq!(bits(&a), bits(&want_a), "{:?}", isa);
            }
        }
    }
}

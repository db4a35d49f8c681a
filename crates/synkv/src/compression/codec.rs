//! The kernels behind a [`GradientCompression`]: `quantize`, `dequantize` and
//! `dequantize_add` dispatched on its type and threshold, the `device` store's compressed
//! reduce built from them, and the conversion of packed words to and from wire bytes.

use std::hash::Hash;

use super::error::{Error, Result};
use super::{onebit, twobit, CompressionType, GradientCompression, Residuals};

impl GradientCompression {
    /// Quantizes `grad` into `out`, updating `residual` in place (2-bit: spec K7.4; 1-bit:
    /// K7.7). `residual` must have `grad.len()` elements (zeros before the first push of its
    /// key and source) and `out` exactly [`compressed_len`](Self::compressed_len)`(grad.len())`
    /// words.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] if a length is wrong (nothing is written then).
    pub fn quantize(&self, grad: &[f32], residual: &mut [f32], out: &mut [u32]) -> Result<()> {
        match self.kind() {
            CompressionType::TwoBit => twobit::quantize(grad, residual, out, self.threshold()),
            CompressionType::OneBit => onebit::quantize(grad, residual, out, self.threshold()),
        }
    }

    /// Writes the `n` values packed in `packed` into `out` (2-bit: `±t` or 0; 1-bit: `±1`).
    /// `out` must have `n` elements and `packed` exactly
    /// [`compressed_len`](Self::compressed_len)`(n)` words.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] if a length is wrong.
    pub fn dequantize(&self, packed: &[u32], n: usize, out: &mut [f32]) -> Result<()> {
        match self.kind() {
            CompressionType::TwoBit => twobit::dequantize(packed, n, self.threshold(), out),
            CompressionType::OneBit => onebit::dequantize(packed, n, out),
        }
    }

    /// Adds the `n` values packed in `packed` to `acc`; bit-identical to
    /// [`dequantize`](Self::dequantize) into a scratch buffer followed by `acc += scratch`.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] if a length is wrong.
    pub fn dequantize_add(&self, packed: &[u32], n: usize, acc: &mut [f32]) -> Result<()> {
        match self.kind() {
            CompressionType::TwoBit => twobit::dequantize_add(packed, n, self.threshold(), acc),
            CompressionType::OneBit => onebit::dequantize_add(packed, n, acc),
        }
    }
}

impl GradientCompression {
    /// The `device` store's reduce with compression (spec K7.9): for each source in order,
    /// quantize its gradient with its residual (created zeroed on first use) into `packed`,
    /// then dequantize the first source into `merged` and add the others to it. `merged` ends
    /// up bit-identical to dequantizing every source and summing left to right, as MXNet does;
    /// with no sources it is zeroed. `packed` is scratch (resized as needed).
    ///
    /// Every push goes through this, even from a single device (its values become quantized).
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] if a gradient's length differs from `merged`'s or its
    /// residual exists with another length.
    pub fn reduce<'a, K: Eq + Hash>(
        &self,
        residuals: &Residuals<K>,
        sources: impl IntoIterator<Item = (K, &'a [f32])>,
        merged: &mut [f32],
        packed: &mut Vec<u32>,
    ) -> Result<()> {
        let n = merged.len();
        packed.resize(self.compressed_len(n), 0);
        let mut first = true;
        for (key, grad) in sources {
            super::error::check_len("GradientCompression::reduce", "a source", n, grad.len())?;
            residuals.quantize(key, self, grad, packed)?;
            if first {
                self.dequantize(packed, n, merged)?;
            } else {
                self.dequantize_add(packed, n, merged)?;
            }
            first = false;
        }
        if first {
            merged.fill(0.0);
        }
        Ok(())
    }
}

/// The wire bytes of packed words: each word little-endian, in order (spec K7.6: the first
/// byte holds the first elements).
pub fn words_to_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Packed words from wire bytes (the inverse of [`words_to_bytes`]).
///
/// # Errors
/// [`Error::RaggedBytes`] if the length is not a multiple of 4.
pub fn words_from_bytes(bytes: &[u8]) -> Result<Vec<u32>> {
    if !bytes.len().is_multiple_of(4) {
        return Err(Error::RaggedBytes(bytes.len()));
    }
    Ok(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatches_on_type() {
        let two = GradientCompression::new(CompressionType::TwoBit, 0.5).unwrap();
        let g = [0.6f32, -0.7, 0.2, 0.5, -0.5, 0.0, 1.2, -0.49];
        let mut r = [0.0f32; 8];
        let mut out = vec![0u32; two.compressed_len(8)];
        two.quantize(&g, &mut r, &mut out).unwrap();
        assert_eq!(words_to_bytes(&out), [0xe3, 0x8c, 0, 0]);
        let mut d = [0.0f32; 8];
        two.dequantize(&out, 8, &mut d).unwrap();
        assert_eq!(d, [0.5, -0.5, 0.0, 0.5, -0.5, 0.0, 0.5, 0.0]);
        two.dequantize_add(&out, 8, &mut d).unwrap();
        assert_eq!(d, [1.0, -1.0, 0.0, 1.0, -1.0, 0.0, 1.0, 0.0]);

        let one = GradientCompression::new(CompressionType::OneBit, 0.0).unwrap();
        let mut r = [0.0f32; 4];
        let mut out = vec![0u32; one.compressed_len(4)];
        one.quantize(&[0.3, -0.2, 0.0, 2.0], &mut r, &mut out).unwrap();
        assert_eq!(words_to_bytes(&out), [0x90, 0, 0, 0]);
        let mut d = [0.0f32; 4];
        one.dequantize(&out, 4, &mut d).unwrap();
        assert_eq!(d, [1.0, -1.0, -1.0, 1.0]);
        assert!(one.dequantize(&out, 40, &mut [0.0; 40]).is_err());
    }

    #[test]
    fn reduce_sums_dequantized_sources_in_order() {
        let gc = GradientCompression::new(CompressionType::TwoBit, 0.5).unwrap();
        let res = Residuals::new();
        let (a, b) = ([0.6f32, -0.7, 0.2, 0.5], [0.5f32, 0.5, 0.4, -0.1]);
        let mut merged = [9.0f32; 4];
        let mut packed = Vec::new();
        gc.reduce(&res, [((1, 0), &a[..]), ((1, 1), &b[..])], &mut merged, &mut packed).unwrap();
        assert_eq!(merged, [1.0, 0.0, 0.0, 0.5]);
        assert_eq!(res.get(&(1, 1)).unwrap().to_vec(), [0.0, 0.0, 0.4, -0.1]);
        // no sources: zeros
        gc.reduce(&res, std::iter::empty(), &mut merged, &mut packed).unwrap();
        assert_eq!(merged, [0.0; 4]);
        // a source of the wrong length
        assert!(gc.reduce(&res, [((2, 0), &a[..3])], &mut merged, &mut packed).is_err());
    }

    #[test]
    fn bytes_round_trip() {
        let words = [0x0000_8ce3u32, 0xdead_beef];
        let bytes = words_to_bytes(&words);
        assert_eq!(bytes, [0xe3, 0x8c, 0, 0, 0xef, 0xbe, 0xad, 0xde]);
        assert_eq!(words_from_bytes(&bytes).unwrap(), words);
        assert_eq!(words_from_bytes(&bytes[..7]), Err(Error::RaggedBytes(7)));
    }
}

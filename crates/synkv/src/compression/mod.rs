//! Gradient compression: MXNet's 2-bit and 1-bit quantization with error feedback
//! (spec K7), as pure functions over slices plus the store of residuals.
//!
//! A store with compression set quantizes each pushed f32 gradient before it crosses a slow
//! link (device → merge device, worker → server), keeping what it did not send in a residual
//! that is added to the next gradient; the receiver dequantizes and sums. The values are
//! bit-exact with MXNet's, including the packed layout on the wire.
//!
//! # Brief overview
//! - [`GradientCompression`] — the validated configuration (`type` + `threshold`), parsed
//!   from MXNet's string pairs ([`GradientCompression::from_pairs`]), from JSON (serde), or
//!   from the wire ([`GradientCompression::from_wire`]); it sizes buffers
//!   ([`compressed_len`](GradientCompression::compressed_len)), splits big keys across servers
//!   ([`partition_words`](GradientCompression::partition_words)) and runs the kernels
//!   ([`quantize`](GradientCompression::quantize), [`dequantize`](GradientCompression::dequantize),
//!   [`dequantize_add`](GradientCompression::dequantize_add)), and runs the `device` store's
//!   whole compressed reduce ([`reduce`](GradientCompression::reduce)).
//! - [`twobit`] and [`onebit`] — the kernels as free functions, each module documenting its
//!   arithmetic and bit layout.
//! - [`Residuals`] / [`Residual`] — residual buffers per (key, source), created zeroed on
//!   first use, each behind its own lock.
//! - [`words_to_bytes`] / [`words_from_bytes`] — packed words ↔ wire bytes (little-endian).
//!
//! This module does not decide *when* to compress (the stores do: `device` compresses every
//! dense f32 push, even from one device; dist workers compress what they send to servers),
//! and it imports nothing from stores, engine or network.
//!
//! # Data layout
//! Packed buffers are `u32` words whose little-endian bytes are MXNet's bytes: 2-bit element
//! `i` in byte `i/4` from the most significant bit pair down, 1-bit element `i` in byte `i/8`
//! at bit `7 − i%8`; unused trailing bits are 0. A key of `n` values packs into
//! `ceil(n/16)` (2-bit) or `ceil(n/32)` (1-bit) words.
//!
//! # Speed
//! Every kernel streams once through its arrays: quantize reads the gradient and the residual
//! and writes the residual and 1/16 (2-bit) or 1/32 (1-bit) of the bytes. The best vector
//! path for the CPU is chosen at run time ([`simd_level`]: AVX-512F, AVX2, else portable
//! code), large arrays (from 512 Ki elements) are split across rayon's current pool, a
//! dequantize into 8 MiB or more writes with non-temporal stores (no read-for-ownership), and
//! every path gives the portable reference's bits (NaN payloads aside), so results depend on
//! neither the machine nor the thread count. No kernel allocates. `synkv bench compression` measures
//! them against the memory bandwidth of the same machine.
//!
//! # Example
//! ```
//! use synkv::compression::{GradientCompression, Residuals, words_to_bytes};
//!
//! // what `set_gradient_compression({"type": "2bit", "threshold": 0.5})` receives
//! let gc = GradientCompression::from_pairs([("type", "2bit"), ("threshold", "0.5")])?;
//!
//! // a device pushes a gradient: quantize with its residual for this key
//! let residuals: Residuals<(i32, usize)> = Residuals::new();
//! let grad = [0.6f32, -0.7, 0.2, 0.5, -0.5, 0.0, 1.2, -0.49];
//! let mut packed = vec![0u32; gc.compressed_len(grad.len())];
//! residuals.quantize((3, 0), &gc, &grad, &mut packed)?;
//! assert_eq!(words_to_bytes(&packed), [0xe3, 0x8c, 0x00, 0x00]);
//!
//! // the merge side dequantizes (the first source) and adds (the others)
//! let mut merged = vec![0.0f32; grad.len()];
//! gc.dequantize(&packed, grad.len(), &mut merged)?;
//! assert_eq!(merged, [0.5, -0.5, 0.0, 0.5, -0.5, 0.0, 0.5, 0.0]);
//! # Ok::<(), synkv::compression::Error>(())
//! ```
#![deny(unsafe_code)]

mod bits;
mod codec;
mod error;
pub mod onebit;
mod parallel;
mod params;
mod residual;
mod simd;
#[cfg(test)]
mod tests;
pub mod twobit;

pub use codec::{words_from_bytes, words_to_bytes};
pub use error::{Error, Result};
pub use params::{CompressionType, GradientCompression};
pub use residual::{Residual, Residuals};

/// The instruction set the compression kernels use on this CPU: `"avx512"`, `"avx2"` or
/// `"scalar"` (detected once, then cached).
pub fn simd_level() -> &'static str {
    simd::Isa::detected().name()
}

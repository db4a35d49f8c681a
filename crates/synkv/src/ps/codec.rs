//! Tensors ↔ chunk bytes: how array data travels in [`Chunk`]s.
//!
//! Values travel as little-endian element bytes (every supported host is little-endian; a
//! big-endian build fails to compile rather than corrupt data). Sending copies the elements
//! once into a `Bytes` (the worker's communication buffer: synkv never aliases a caller's
//! array, spec K12.1); slices of that `Bytes` then go to each server without copying.
//! Receiving views a chunk in place when it is aligned for its element type (the frame
//! layout keeps chunks 8-byte aligned relative to the frame) and copies only otherwise.
//!
//! Every function checks lengths and dtypes and returns [`CodecError`]; nothing here panics
//! on peer input. This module knows arrays' buffers ([`Buffer`]) but no store, key or engine.

use std::any::TypeId;
use std::borrow::Cow;

use bytes::Bytes;

use super::proto::{Chunk, DTypeCode};
use crate::kernels::{self, Element};
use crate::ndarray::{Buffer, DType};
use crate::with_buffer;

#[cfg(target_endian = "big")]
compile_error!("synkv's wire format is little-endian; big-endian hosts are not supported");

/// Why chunk bytes could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The chunk's element type is not one arrays hold.
    #[error("chunk dtype {0:?} is not an array element type (f32, f64, f16, bf16, i32, i64)")]
    UnsupportedDType(DTypeCode),
    /// The chunk has another number of elements than expected.
    #[error("chunk holds {got} elements, expected {expected}")]
    Length {
        /// What the destination needs.
        expected: usize,
        /// What the chunk holds.
        got: usize,
    },
    /// Row ids out of order or out of range.
    #[error("invalid row ids: {0}")]
    RowIds(String),
}

/// The wire code of an array dtype.
pub fn dtype_code(dtype: DType) -> DTypeCode {
    match dtype {
        DType::F32 => DTypeCode::F32,
        DType::F64 => DTypeCode::F64,
        DType::F16 => DTypeCode::F16,
        DType::BF16 => DTypeCode::BF16,
        DType::I32 => DTypeCode::I32,
        DType::I64 => DTypeCode::I64,
    }
}

/// The array dtype of a wire code, if arrays can hold it.
pub fn dtype_of(code: DTypeCode) -> Result<DType, CodecError> {
    Ok(match code {
        DTypeCode::F32 => DType::F32,
        DTypeCode::F64 => DType::F64,
        DTypeCode::F16 => DType::F16,
        DTypeCode::BF16 => DType::BF16,
        DTypeCode::I32 => DType::I32,
        DTypeCode::I64 => DType::I64,
        other => return Err(CodecError::UnsupportedDType(other)),
    })
}

/// Elements of a chunk as `&[T]`: in place when aligned, else copied.
fn view<T: bytemuck::Pod>(data: &Bytes) -> Cow<'_, [T]> {
    match bytemuck::try_cast_slice::<u8, T>(data) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => {
            let mut v = vec![T::zeroed(); data.len() / std::mem::size_of::<T>()];
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
            let n = bytes.len();
            bytes.copy_from_slice(&data[..n]);
            Cow::Owned(v)
        }
    }
}

/// Runs `$body` with `$s` bound to the chunk's elements as a typed slice.
macro_rules! with_chunk {
    ($chunk:expr, $s:ident => $body:expr) => {
        match $chunk.dtype {
            DTypeCode::F32 => {
                let $s = view::<f32>(&$chunk.data);
                $body
            }
            DTypeCode::F64 => {
                let $s = view::<f64>(&$chunk.data);
                $body
            }
            DTypeCode::F16 => {
                let $s = view::<half::f16>(&$chunk.data);
                $body
            }
            DTypeCode::BF16 => {
                let $s = view::<half::bf16>(&$chunk.data);
                $body
            }
            DTypeCode::I32 => {
                let $s = view::<i32>(&$chunk.data);
                $body
            }
            DTypeCode::I64 => {
                let $s = view::<i64>(&$chunk.data);
                $body
            }
            other => return Err(CodecError::UnsupportedDType(other)),
        }
    };
}

/// Number of elements in a chunk.
pub fn chunk_len(chunk: &Chunk) -> usize {
    // The decoder guarantees a whole number of elements.
    chunk.data.len() / usize::try_from(chunk.dtype.size()).unwrap_or(1)
}

/// The elements `[off, off + len)` of `buf` as chunk bytes (one copy).
///
/// # Panics
/// If the range is outside `buf` (callers compute it from the buffer's own length).
pub fn range_to_bytes(buf: &Buffer, off: usize, len: usize) -> Bytes {
    with_buffer!(buf, v => Bytes::copy_from_slice(bytemuck::cast_slice(&v[off..off + len])))
}

/// All elements of `buf` as chunk bytes (one copy).
pub fn buffer_to_bytes(buf: &Buffer) -> Bytes {
    range_to_bytes(buf, 0, buf.len())
}

/// The element bytes of a buffer.
pub fn buffer_bytes(buf: &Buffer) -> &[u8] {
    with_buffer!(buf, v => bytemuck::cast_slice(&v[..]))
}

/// The element bytes of a buffer, writable (to read a value straight into it).
pub fn buffer_bytes_mut(buf: &mut Buffer) -> &mut [u8] {
    with_buffer!(buf, v => bytemuck::cast_slice_mut(&mut v[..]))
}

/// Owns a buffer and lends its element bytes (for [`Bytes::from_owner`]).
struct Owned(Buffer);

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        buffer_bytes(&self.0)
    }
}

/// `buf`'s elements as chunk bytes without copying (the `Bytes` owns the buffer).
pub fn buffer_into_bytes(buf: Buffer) -> Bytes {
    Bytes::from_owner(Owned(buf))
}

/// A buffer shared with the network (for [`Bytes::from_owner`]).
struct Shared(std::sync::Arc<Buffer>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        buffer_bytes(&self.0)
    }
}

/// A shared buffer's elements as chunk bytes without copying: the `Bytes` holds a handle, so
/// the owner can tell (by the handle count) when no message uses the buffer any more.
pub fn shared_buffer_bytes(buf: std::sync::Arc<Buffer>) -> Bytes {
    Bytes::from_owner(Shared(buf))
}

/// Packed compression words shared with the network (for [`Bytes::from_owner`]).
struct Words(std::sync::Arc<Vec<u32>>);

impl AsRef<[u8]> for Words {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// Packed gradient-compression words as chunk bytes without copying. The caller may keep a
/// clone of the `Arc` and reuse the allocation once [`Arc::get_mut`] succeeds (every `Bytes`
/// view dropped).
pub fn words_into_bytes(words: std::sync::Arc<Vec<u32>>) -> Bytes {
    Bytes::from_owner(Words(words))
}

/// The packed words of a compressed chunk (`U32`, little-endian): in place when aligned, else
/// copied.
pub fn words_of(chunk: &Chunk) -> Result<Cow<'_, [u32]>, CodecError> {
    if chunk.dtype != DTypeCode::U32 {
        return Err(CodecError::UnsupportedDType(chunk.dtype));
    }
    Ok(view::<u32>(&chunk.data))
}

/// A copy of `src`, written into `spare`'s allocation when `spare` is its only handle and
/// large enough (so a key's communication buffer is allocated once, not at every push: large
/// fresh allocations cost a page fault per page).
pub fn copy_reusing(src: &[u8], spare: Option<Bytes>) -> Bytes {
    match spare.map(Bytes::try_into_mut) {
        // The usual case: the same key's last buffer, as long as this value. Its old bytes
        // are overwritten (streaming, when large) without being read.
        Some(Ok(mut b)) if b.len() >= src.len() => {
            b.truncate(src.len());
            kernels::copy_bytes(&mut b, src);
            b.freeze()
        }
        Some(Ok(mut b)) if b.capacity() >= src.len() => {
            b.clear();
            b.extend_from_slice(src);
            b.freeze()
        }
        _ => Bytes::copy_from_slice(src),
    }
}

/// `dst = Σ chunks` (converting dtypes), every chunk with `dst.len()` elements. One pass when
/// every chunk has `dst`'s dtype.
pub fn sum_chunks_into(dst: &mut Buffer, chunks: &[Chunk]) -> Result<(), CodecError> {
    let n = dst.len();
    for c in chunks {
        check_len(n, c)?;
    }
    let Some((first, rest)) = chunks.split_first() else {
        return Ok(());
    };
    let same = chunks.iter().all(|c| dtype_of(c.dtype).ok() == Some(dst.dtype()));
    if same && chunks.len() > 1 {
        fn typed<T: Element + bytemuck::Pod>(d: &mut [T], chunks: &[Chunk]) {
            let views: Vec<Cow<'_, [T]>> = chunks.iter().map(|c| view::<T>(&c.data)).collect();
            let refs: Vec<&[T]> = views.iter().map(|v| &v[..]).collect();
            kernels::sum_into(d, &refs);
        }
        with_buffer!(dst, d => typed(&mut d[..], chunks));
        return Ok(());
    }
    copy_chunk_into(dst, 0, n, first)?;
    for c in rest {
        add_chunk_into(dst, 0, n, c)?;
    }
    Ok(())
}

/// A chunk of `buf`'s elements `[off, off + len)`.
pub fn range_to_chunk(buf: &Buffer, off: usize, len: usize) -> Chunk {
    Chunk { dtype: dtype_code(buf.dtype()), data: range_to_bytes(buf, off, len) }
}

fn check_len(expected: usize, chunk: &Chunk) -> Result<(), CodecError> {
    let got = chunk_len(chunk);
    if got != expected {
        return Err(CodecError::Length { expected, got });
    }
    Ok(())
}

fn add_cast<T: Element + bytemuck::Pod, S: Element + bytemuck::Pod>(dst: &mut [T], src: &[S]) {
    if TypeId::of::<T>() == TypeId::of::<S>() {
        // Same type: the cast is the identity.
        kernels::add_into(dst, bytemuck::cast_slice::<S, T>(src));
    } else {
        let mut tmp = vec![T::default(); src.len()];
        kernels::cast(&mut tmp, src);
        kernels::add_into(dst, &tmp);
    }
}

/// `dst[off..off + n] = chunk` (converting dtypes), where `n` is the chunk's element count,
/// which must equal `len`.
pub fn copy_chunk_into(dst: &mut Buffer, off: usize, len: usize, chunk: &Chunk) -> Result<(), CodecError> {
    check_len(len, chunk)?;
    let end =
        off.checked_add(len).filter(|e| *e <= dst.len()).ok_or(CodecError::Length { expected: dst.len(), got: off.saturating_add(len) })?;
    with_buffer!(dst, d => with_chunk!(chunk, s => kernels::cast(&mut d[off..end], &s)));
    Ok(())
}

/// `dst[off..off + len] += chunk` (converting dtypes).
pub fn add_chunk_into(dst: &mut Buffer, off: usize, len: usize, chunk: &Chunk) -> Result<(), CodecError> {
    check_len(len, chunk)?;
    let end =
        off.checked_add(len).filter(|e| *e <= dst.len()).ok_or(CodecError::Length { expected: dst.len(), got: off.saturating_add(len) })?;
    with_buffer!(dst, d => with_chunk!(chunk, s => add_cast(&mut d[off..end], &s)));
    Ok(())
}

/// A new buffer of `dtype` holding the chunk's elements (converted).
pub fn chunk_to_buffer(chunk: &Chunk, dtype: DType) -> Result<Buffer, CodecError> {
    let mut out = Buffer::zeros(dtype, chunk_len(chunk));
    let n = out.len();
    copy_chunk_into(&mut out, 0, n, chunk)?;
    Ok(out)
}

/// Row ids as an `I64` chunk.
pub fn ids_to_chunk(ids: &[i64]) -> Chunk {
    Chunk { dtype: DTypeCode::I64, data: Bytes::copy_from_slice(bytemuck::cast_slice(ids)) }
}

/// Row ids from an `I64` chunk: sorted, unique, each in `0..rows`.
pub fn ids_from_chunk(chunk: &Chunk, rows: usize) -> Result<Vec<i64>, CodecError> {
    if chunk.dtype != DTypeCode::I64 {
        return Err(CodecError::RowIds(format!("row ids must be i64, got {:?}", chunk.dtype)));
    }
    let ids = view::<i64>(&chunk.data).into_owned();
    if let Some(w) = ids.windows(2).find(|w| w[0] >= w[1]) {
        return Err(CodecError::RowIds(format!("not sorted and unique: {} before {}", w[0], w[1])));
    }
    if let Some(bad) = ids.iter().find(|&&i| i < 0 || usize::try_from(i).map_or(true, |i| i >= rows)) {
        return Err(CodecError::RowIds(format!("row id {bad} is outside 0..{rows}")));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn round_trip_and_conversion() {
        let b = Buffer::from_vec(vec![1.0f32, 2.0, 3.0, 4.0]);
        let c = range_to_chunk(&b, 1, 2);
        assert_eq!(c.dtype, DTypeCode::F32);
        assert_eq!(chunk_to_buffer(&c, DType::F32).unwrap(), Buffer::from_vec(vec![2.0f32, 3.0]));
        assert_eq!(chunk_to_buffer(&c, DType::F16).unwrap(), Buffer::from_vec(vec![f16::from_f32(2.0), f16::from_f32(3.0)]));
        let mut sum = Buffer::zeros(DType::F32, 2);
        sum_chunks_into(&mut sum, &[c.clone(), c.clone(), c.clone()]).unwrap();
        assert_eq!(sum, Buffer::from_vec(vec![6.0f32, 9.0]));
        assert_eq!(buffer_into_bytes(Buffer::from_vec(vec![1.0f32])), Bytes::copy_from_slice(&1.0f32.to_le_bytes()));
        let first = copy_reusing(&[1, 2, 3], None);
        let ptr = first.as_ptr();
        let again = copy_reusing(&[4, 5], Some(first));
        assert_eq!((&again[..], again.as_ptr()), (&[4u8, 5][..], ptr), "the spare allocation is reused");
        let mut acc = Buffer::from_vec(vec![10.0f32; 4]);
        add_chunk_into(&mut acc, 2, 2, &c).unwrap();
        assert_eq!(acc, Buffer::from_vec(vec![10.0f32, 10.0, 12.0, 13.0]));
        let h = range_to_chunk(&Buffer::from_vec(vec![f16::from_f32(0.5); 2]), 0, 2);
        add_chunk_into(&mut acc, 0, 2, &h).unwrap();
        assert_eq!(acc.to_vec::<f32>()[..2], [10.5, 10.5]);
    }

    #[test]
    fn packed_words_travel_without_a_copy() {
        let words = std::sync::Arc::new(vec![0x0000_8ce3u32, 7]);
        let bytes = words_into_bytes(std::sync::Arc::clone(&words));
        assert_eq!(&bytes[..4], &[0xe3, 0x8c, 0, 0], "little-endian words, MXNet's byte order");
        let chunk = Chunk { dtype: DTypeCode::U32, data: bytes.slice(4..) };
        assert_eq!(&*words_of(&chunk).unwrap(), &[7]);
        assert!(words_of(&Chunk::bytes(Bytes::from_static(&[0; 4]))).is_err(), "only U32 chunks hold words");
        drop((bytes, chunk));
        let mut words = words;
        assert!(std::sync::Arc::get_mut(&mut words).is_some(), "the allocation is free again once the views are dropped");
    }

    #[test]
    fn misaligned_chunks_are_copied_not_refused() {
        let raw = Bytes::from(vec![0u8; 13]);
        let data = raw.slice(1..9); // 8 bytes at an odd address
        let c = Chunk { dtype: DTypeCode::F32, data };
        assert_eq!(chunk_to_buffer(&c, DType::F32).unwrap().len(), 2);
    }

    #[test]
    fn bad_input_is_an_error() {
        let c = range_to_chunk(&Buffer::from_vec(vec![1.0f32; 3]), 0, 3);
        let mut dst = Buffer::zeros(DType::F32, 2);
        assert!(matches!(copy_chunk_into(&mut dst, 0, 2, &c), Err(CodecError::Length { .. })));
        assert!(copy_chunk_into(&mut dst, 1, 3, &c).is_err());
        let u8s = Chunk::bytes(Bytes::from_static(&[1, 2]));
        assert!(matches!(chunk_to_buffer(&u8s, DType::F32), Err(CodecError::UnsupportedDType(_))));
        assert!(ids_from_chunk(&ids_to_chunk(&[0, 2, 5]), 6).is_ok());
        assert!(ids_from_chunk(&ids_to_chunk(&[2, 2]), 6).is_err());
        assert!(ids_from_chunk(&ids_to_chunk(&[6]), 6).is_err());
        assert!(ids_from_chunk(&ids_to_chunk(&[-1]), 6).is_err());
    }
}

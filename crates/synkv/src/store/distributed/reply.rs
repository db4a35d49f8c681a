//! The answers of an operation: pulled values written into the outputs, and a server's
//! refusal turned back into the typed error a local store returns.

use super::build::Places;
use super::keys::KeyInfo;
use super::ops::{Item, Kind};
use crate::ndarray::{Buffer, RowSparse, Storage};
use crate::ps::codec::{self, chunk_len};
use crate::ps::proto::{Chunk, Command, ErrorCode, Flags, Message};
use crate::ps::transport::Landing;
use crate::ps::Error as DistError;
use crate::store::Error as StoreError;

/// Writes pulled values into the outputs. With a landing (`landing.rs`), each part's first
/// output is written through its target: already written when the reply landed, copied into
/// it otherwise; further outputs get a copy.
pub(crate) fn write_back(
    kind: Kind,
    items: &[Item],
    places: &[Places],
    replies: &[Message],
    landings: &[Option<&Landing>],
) -> Result<(), DistError> {
    if kind == Kind::Push {
        return Ok(());
    }
    for (m, (place, reply)) in places.iter().zip(replies).enumerate() {
        let landing = landings.get(m).copied().flatten();
        let mut targets = landing.map(Landing::targets);
        if reply.flags.contains(Flags::LANDED) && targets.as_ref().is_none_or(|t| t.is_none()) {
            let detail = "an answer landed without its destinations".to_owned();
            return Err(DistError::Unexpected { peer: format!("node {}", reply.sender), command: Command::Reply, detail });
        }
        let per_key = if kind == Kind::RowSparsePull { 2 } else { 1 };
        if reply.meta.keys.len() != place.len() || reply.chunks.len() != place.len() * per_key {
            let detail = format!("{} keys and {} chunks for a request of {} keys", reply.meta.keys.len(), reply.chunks.len(), place.len());
            return Err(DistError::Unexpected { peer: format!("node {}", reply.sender), command: Command::Reply, detail });
        }
        for (j, &(i, part, start)) in place.iter().enumerate() {
            let item = &items[i];
            let slice = item.info.slices[part];
            check_part(reply, j, &item.info, part)?;
            let unit = item.info.unit();
            let fail = |e: codec::CodecError| DistError::Unexpected {
                peer: format!("node {}", reply.sender),
                command: Command::Reply,
                detail: format!("value of key {}: {e}", item.info.key),
            };
            if kind == Kind::RowSparsePull {
                let data = &reply.chunks[2 * j + 1];
                let n = chunk_len(&reply.chunks[2 * j]);
                for out in &item.outs {
                    let mut st = out.storage_mut();
                    if let Storage::RowSparse(r) = &mut *st {
                        codec::copy_chunk_into(&mut r.data, start * unit, n * unit, data).map_err(fail)?;
                    }
                }
            } else {
                let mut outs = &item.outs[..];
                let mut landed = None;
                if let Some(Some(targets)) = targets.as_deref_mut() {
                    // The first output is loaned: written only through its target.
                    let Some(target) = targets.get_mut(j) else { continue };
                    let dst = target.bytes_mut();
                    if !reply.flags.contains(Flags::LANDED) {
                        let src = &reply.chunks[j].data;
                        if src.len() != dst.len() || reply.chunks[j].dtype != codec::dtype_code(item.info.dtype) {
                            return Err(fail(codec::CodecError::Length { expected: dst.len(), got: src.len() }));
                        }
                        let whole = item.info.shape.size() * item.info.dtype.size_of();
                        crate::kernels::copy_element_bytes(dst, src, whole);
                    }
                    outs = outs.get(1..).unwrap_or(&[]);
                    if !outs.is_empty() && reply.flags.contains(Flags::LANDED) {
                        // The answer is only in the first output: the others copy it from there.
                        landed = Some(Chunk { dtype: reply.chunks[j].dtype, data: bytes::Bytes::copy_from_slice(dst) });
                    }
                }
                let chunk = landed.as_ref().unwrap_or(&reply.chunks[j]);
                for out in outs {
                    let mut st = out.storage_mut();
                    if let Some(d) = st.dense_mut() {
                        codec::copy_chunk_into(d, slice.offset * unit, slice.len * unit, chunk).map_err(fail)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Checks that key `j` of `reply` is part `part` of `info` (its ps key and offset), as the
/// request asked.
pub(crate) fn check_part(reply: &Message, j: usize, info: &KeyInfo, part: usize) -> Result<(), DistError> {
    let slice = info.slices[part];
    let offset = reply.meta.offsets.get(j).copied().unwrap_or(0);
    if reply.meta.keys.get(j) != Some(&info.ps) || offset != u64::try_from(slice.offset).unwrap_or(u64::MAX) {
        let got = reply.meta.keys.get(j).map_or_else(|| "nothing".to_owned(), |k| format!("key {k}"));
        let detail = format!("{got} (part at {offset}) answered in place of key {} (part at {})", info.key, slice.offset);
        return Err(DistError::Unexpected { peer: format!("node {}", reply.sender), command: Command::Reply, detail });
    }
    Ok(())
}

/// Prepares the outputs of a row_sparse pull (inside the operation, which holds their vars):
/// exactly the requested rows, zero until filled.
pub(crate) fn prepare_row_outputs(item: &Item) {
    for out in &item.outs {
        let rows = RowSparse { indices: item.ids.clone(), data: Buffer::zeros(out.dtype(), item.ids.len() * item.info.shape.row_len()) };
        *out.storage_mut() = Storage::RowSparse(rows);
    }
}

/// A server's refusal as the error a local store gives for the same mistake, where there is
/// one (the key is found among `items` by the ps key the server named); otherwise the
/// distributed error itself, which keeps the code.
pub(crate) fn refusal(e: DistError, op: &'static str, mut keys: impl Iterator<Item = (u64, crate::store::Key)>) -> crate::Error {
    if let DistError::Refused { code, key: Some((ps, _)), .. } = &e {
        if let Some((_, key)) = keys.find(|(p, _)| p == ps) {
            match code {
                ErrorCode::NotInitialized => return StoreError::NotInitialized { op, key }.into(),
                ErrorCode::DuplicateInit => return StoreError::DuplicateInit { key }.into(),
                _ => {}
            }
        }
    }
    e.into()
}

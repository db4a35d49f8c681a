//! The server's keys: one [`Entry`] per ps key (its name, its value — or this server's slice
//! of it — and the sync round in progress), and the parsing of data messages into per-key
//! [`Value`]s.
//!
//! Message layout (see the table in [`crate::ps::proto`]): a dense `Push`/`PushPull` carries
//! one chunk per key; a row_sparse one (flag `ROW_SPARSE`) carries two per key, the row ids
//! (`i64`, relative to this server's slice) then the rows. Values are validated against the
//! entry (dtype, element count, row ids) before anything changes, so a refused request leaves
//! every key untouched.
//!
//! Sums are computed in f32 for f16/bf16 keys (in the key's type otherwise) and rounded once
//! when the round completes (spec K6.15's cast-before-summation, for every key).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use crate::compression::GradientCompression;
use crate::ndarray::{sparse, Buffer, DType, RowSparse, Storage};
use crate::optimizer::{GradRef, Updater, WeightMut};
use crate::ps::codec::{self, chunk_len, chunk_to_buffer, dtype_of};
use crate::ps::node::Rank;
use crate::ps::proto::{Chunk, DTypeCode, Flags, Message};

/// A request: (connection, request id).
pub(super) type ReqId = (u64, u64);

/// One key's part of a data message, before validation against the entry.
pub(super) enum Value {
    /// Every element of this server's slice.
    Dense(Chunk),
    /// Every element of this server's slice as gradient-compression words (`U32`).
    Packed(GradientCompression, Chunk),
    /// Some rows: ids (`i64` chunk) and their data.
    Rows { ids: Chunk, data: Chunk },
}

/// A value validated against its entry.
pub(super) enum Checked {
    Dense(Chunk),
    Packed(GradientCompression, Chunk),
    Rows(Vec<i64>, Chunk),
}

/// One push of a dense key in a round: its values, or its packed words.
pub(super) enum Part {
    Raw(Chunk),
    Packed(GradientCompression, Chunk),
}

/// Splits a `Push`/`PushPull` into (ps key, value) pairs, checking the chunk layout.
///
/// A compressed push (flag `COMPRESSED`) names its configuration in the text field as JSON
/// (`{"type":"2bit","threshold":0.5}`), validated as `set_gradient_compression` validates it.
pub(super) fn push_values(msg: &Message) -> Result<Vec<(u64, Value)>, String> {
    let keys = &msg.meta.keys;
    let rows = msg.flags.contains(Flags::ROW_SPARSE);
    let packed = if msg.flags.contains(Flags::COMPRESSED) {
        if rows || msg.flags.contains(Flags::INIT) {
            return Err("compressed values are dense gradient pushes; row_sparse values and init values travel uncompressed".into());
        }
        let gc: GradientCompression = serde_json::from_str(&msg.meta.text)
            .map_err(|e| format!("a compressed push needs its configuration as JSON in the text field: {e}"))?;
        Some(gc)
    } else {
        None
    };
    let per_key = if rows { 2 } else { 1 };
    if msg.chunks.len() != keys.len() * per_key {
        return Err(format!("{} keys need {} chunks, got {}", keys.len(), keys.len() * per_key, msg.chunks.len()));
    }
    let mut out = Vec::with_capacity(keys.len());
    for (i, &key) in keys.iter().enumerate() {
        let value = if rows {
            Value::Rows { ids: msg.chunks[2 * i].clone(), data: msg.chunks[2 * i + 1].clone() }
        } else if let Some(gc) = packed {
            Value::Packed(gc, msg.chunks[i].clone())
        } else {
            Value::Dense(msg.chunks[i].clone())
        };
        out.push((key, value));
    }
    Ok(out)
}

/// A dense value as a round part, or the value back if it is rows.
fn dense_part(value: Checked) -> Result<Part, Checked> {
    match value {
        Checked::Dense(chunk) => Ok(Part::Raw(chunk)),
        Checked::Packed(gc, words) => Ok(Part::Packed(gc, words)),
        rows => Err(rows),
    }
}

/// The compute type of sums: f32 for half types, the key's own type otherwise.
fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

/// The pushes of one round, summed when the round completes (one pass, straight into the
/// value for an assign).
pub(super) enum Merged {
    Dense(Vec<Part>),
    Rows(Vec<RowSparse>),
}

/// The sync round of one key: what has been merged, from whom, who waits for it.
#[derive(Default)]
pub(super) struct Round {
    merged: Option<Merged>,
    pub(super) contributors: BTreeSet<Rank>,
    /// Requests waiting for this round, with the key's position in each request.
    pub(super) waiting: Vec<(ReqId, usize)>,
    /// Pushes from workers already counted in this round, for the next one (spec K12.10).
    pub(super) queued: VecDeque<Contribution>,
}

/// A push waiting for a later round.
pub(super) struct Contribution {
    pub(super) worker: Rank,
    pub(super) req: ReqId,
    pub(super) slot: usize,
    pub(super) value: Checked,
}

/// One key held by this server.
pub(super) struct Entry {
    /// The user's name for the key (its display form), used by the optimizer.
    pub(super) name: String,
    /// The value, shared with the replies that carry it (pulls send it without a copy); an
    /// update writes in place when no reply holds it any more, else into another buffer.
    value: Arc<Buffer>,
    /// A previous value still held by a reply when it was replaced; reused once free.
    spare: Option<Arc<Buffer>>,
    /// `Some(row_len)` for a row_sparse key.
    row_len: Option<usize>,
    /// The sum of a round for the optimizer (compute dtype), kept across rounds.
    scratch: Option<Buffer>,
    pub(super) round: Round,
}

impl Entry {
    /// A new key from its init value.
    pub(super) fn from_init(name: String, value: Value) -> Result<Entry, String> {
        match value {
            Value::Packed(..) => Err("init values travel uncompressed".into()),
            Value::Dense(chunk) => {
                let dtype = dtype_of(chunk.dtype).map_err(|e| e.to_string())?;
                let value = chunk_to_buffer(&chunk, dtype).map_err(|e| e.to_string())?;
                Ok(Entry { name, value: Arc::new(value), spare: None, row_len: None, scratch: None, round: Round::default() })
            }
            Value::Rows { ids, data } => {
                let n_ids = chunk_len(&ids);
                let all = codec::ids_from_chunk(&ids, n_ids).map_err(|e| e.to_string())?;
                if all.is_empty() || all.len() != n_ids {
                    return Err("a row_sparse key is initialised with every row present (init with empty data is not supported)".into());
                }
                let elems = chunk_len(&data);
                if !elems.is_multiple_of(n_ids) {
                    return Err(format!("{elems} elements do not split into {n_ids} rows"));
                }
                let dtype = dtype_of(data.dtype).map_err(|e| e.to_string())?;
                let value = chunk_to_buffer(&data, dtype).map_err(|e| e.to_string())?;
                Ok(Entry {
                    name,
                    value: Arc::new(value),
                    spare: None,
                    row_len: Some(elems / n_ids),
                    scratch: None,
                    round: Round::default(),
                })
            }
        }
    }

    fn rows(&self) -> usize {
        self.row_len.map_or(1, |r| self.value.len().checked_div(r).unwrap_or(0))
    }

    /// Validates a pushed value against this key.
    pub(super) fn check(&self, value: Value) -> Result<Checked, String> {
        let dtype = self.value.dtype();
        match (value, self.row_len) {
            (Value::Dense(chunk), None) => {
                if dtype_of(chunk.dtype).ok() != Some(dtype) {
                    return Err(format!("key {} holds {dtype} values, got {:?}", self.name, chunk.dtype));
                }
                if chunk_len(&chunk) != self.value.len() {
                    let got = chunk_len(&chunk);
                    return Err(format!(
                        "key {} holds {} elements here, got {got} (the size of a key cannot change)",
                        self.name,
                        self.value.len()
                    ));
                }
                Ok(Checked::Dense(chunk))
            }
            (Value::Rows { ids, data }, Some(row_len)) => {
                let ids = codec::ids_from_chunk(&ids, self.rows()).map_err(|e| format!("key {}: {e}", self.name))?;
                if dtype_of(data.dtype).ok() != Some(dtype) {
                    return Err(format!("key {} holds {dtype} values, got {:?}", self.name, data.dtype));
                }
                if chunk_len(&data) != ids.len() * row_len {
                    return Err(format!(
                        "key {}: {} rows of {row_len} need {} elements, got {}",
                        self.name,
                        ids.len(),
                        ids.len() * row_len,
                        chunk_len(&data)
                    ));
                }
                Ok(Checked::Rows(ids, data))
            }
            (Value::Packed(gc, words), None) => {
                if dtype != DType::F32 {
                    return Err(format!("key {} holds {dtype} values; compressed pushes carry float32 gradients only", self.name));
                }
                let expected = gc.compressed_len(self.value.len());
                if words.dtype != DTypeCode::U32 || chunk_len(&words) != expected {
                    return Err(format!(
                        "key {}: {} elements here need {expected} packed {} words, got {} {:?} elements (workers must split keys alike: set gradient compression before init on every worker)",
                        self.name,
                        self.value.len(),
                        gc.kind(),
                        chunk_len(&words),
                        words.dtype
                    ));
                }
                Ok(Checked::Packed(gc, words))
            }
            (Value::Dense(_) | Value::Packed(..), Some(_)) => Err(format!("key {} is row_sparse; push row_sparse values to it", self.name)),
            (Value::Rows { .. }, None) => Err(format!("key {} is dense; row_sparse values cannot be pushed to it", self.name)),
        }
    }

    /// Adds a checked value to this round's sum and records who sent it.
    pub(super) fn merge(&mut self, worker: Rank, req: ReqId, slot: usize, value: Checked) -> Result<(), String> {
        let cdt = compute_dtype(self.value.dtype());
        let round = &mut self.round;
        match (dense_part(value), &mut round.merged) {
            (Ok(part), None) => round.merged = Some(Merged::Dense(vec![part])),
            (Ok(part), Some(Merged::Dense(parts))) => parts.push(part),
            (Err(value), merged) => {
                let Checked::Rows(ids, data) = value else { return Err("unexpected value".into()) };
                let part = RowSparse { indices: ids, data: chunk_to_buffer(&data, cdt).map_err(|e| e.to_string())? };
                match merged {
                    Some(Merged::Rows(parts)) => parts.push(part),
                    None => *merged = Some(Merged::Rows(vec![part])),
                    Some(Merged::Dense(_)) => return Err("dense and row_sparse pushes mixed in one round".into()),
                }
            }
            (Ok(_), Some(Merged::Rows(_))) => return Err("dense and row_sparse pushes mixed in one round".into()),
        }
        round.contributors.insert(worker);
        round.waiting.push((req, slot));
        Ok(())
    }

    /// Ends the round: returns what was merged and who waits for it; `queued` stays.
    pub(super) fn take_round(&mut self) -> (Option<Merged>, Vec<(ReqId, usize)>) {
        self.round.contributors.clear();
        (self.round.merged.take(), std::mem::take(&mut self.round.waiting))
    }

    /// A checked value as a one-push round (async mode).
    pub(super) fn single(&self, value: Checked) -> Result<Merged, String> {
        let cdt = compute_dtype(self.value.dtype());
        Ok(match value {
            Checked::Dense(chunk) => Merged::Dense(vec![Part::Raw(chunk)]),
            Checked::Packed(gc, words) => Merged::Dense(vec![Part::Packed(gc, words)]),
            Checked::Rows(ids, data) => {
                Merged::Rows(vec![RowSparse { indices: ids, data: chunk_to_buffer(&data, cdt).map_err(|e| e.to_string())? }])
            }
        })
    }

    /// Applies a round's sum: the updater if one is installed, else `value := sum` (for a
    /// row_sparse key, rows absent from the sum become zero).
    pub(super) fn apply(&mut self, merged: Merged, updater: Option<&mut Updater>) -> Result<(), String> {
        let dtype = self.value.dtype();
        let name = self.name.clone();
        let fail = |e: crate::optimizer::Error| format!("updating key {name}: {e}");
        let cdt = compute_dtype(dtype);
        match merged {
            Merged::Dense(parts) if parts.iter().any(|p| matches!(p, Part::Packed(..))) => {
                self.apply_packed(&parts, updater)?;
            }
            Merged::Dense(parts) => {
                let chunks: Vec<Chunk> = parts.into_iter().filter_map(|p| if let Part::Raw(c) = p { Some(c) } else { None }).collect();
                let codec_fail = |e: codec::CodecError| format!("updating key {name}: {e}");
                if updater.is_none() && cdt == dtype {
                    // Assign: the sum goes straight into the value.
                    return codec::sum_chunks_into(self.value_mut(true), &chunks).map_err(codec_fail);
                }
                let mut scratch = self.take_scratch(cdt);
                let summed = codec::sum_chunks_into(&mut scratch, &chunks).map_err(codec_fail);
                let result = summed.and_then(|()| match updater {
                    None => {
                        self.value_mut(true).assign_cast(&scratch);
                        Ok(())
                    }
                    Some(u) => {
                        let cast;
                        let grad = if cdt == dtype {
                            &scratch
                        } else {
                            cast = scratch.cast(dtype);
                            &cast
                        };
                        u.update(&name, weight_mut(self.value_mut(false))?, grad_ref(grad)?).map_err(fail)
                    }
                });
                self.scratch = Some(scratch);
                result?;
            }
            Merged::Rows(parts) => {
                let row_len = self.row_len.unwrap_or(1);
                let rows = self.rows();
                let storages: Vec<Storage> = parts.into_iter().map(Storage::RowSparse).collect();
                let refs: Vec<&Storage> = storages.iter().collect();
                let sum = sparse::sum_row_sparse(&refs, rows, row_len, compute_dtype(dtype));
                let data = if sum.data.dtype() == dtype { sum.data } else { sum.data.cast(dtype) };
                match updater {
                    None => {
                        let len = self.value.len();
                        let value = self.value_mut(true);
                        *value = Buffer::zeros(dtype, len);
                        for (i, &id) in sum.indices.iter().enumerate() {
                            let id = usize::try_from(id).unwrap_or(0);
                            value.copy_range_from(id * row_len, &data, i * row_len, row_len);
                        }
                    }
                    Some(u) => {
                        u.update_row_sparse(&name, weight_mut(self.value_mut(false))?, row_len, &sum.indices, grad_ref(&data)?)
                            .map_err(fail)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies a round of a dense f32 key in which some pushes are packed words: each push is
    /// dequantized (the first) or dequantized and added (the others) straight into the value
    /// (assign) or into the scratch sum (updater), then the updater runs (spec K7.10).
    fn apply_packed(&mut self, parts: &[Part], updater: Option<&mut Updater>) -> Result<(), String> {
        let name = self.name.clone();
        let n = self.value.len();
        let mut scratch = updater.is_some().then(|| self.take_scratch(DType::F32));
        let target = match scratch.as_mut() {
            Some(s) => s,
            None => self.value_mut(true),
        };
        for (i, part) in parts.iter().enumerate() {
            let first = i == 0;
            let done = match (part, &mut *target) {
                (Part::Packed(gc, words), Buffer::F32(v)) => {
                    let words = codec::words_of(words).map_err(|e| format!("key {name}: {e}"))?;
                    if first { gc.dequantize(&words, n, v) } else { gc.dequantize_add(&words, n, v) }.map_err(|e| e.to_string())
                }
                (Part::Packed(..), other) => {
                    Err(format!("it holds {} values; compressed pushes carry float32 gradients only", other.dtype()))
                }
                (Part::Raw(chunk), t) => if first { codec::copy_chunk_into(t, 0, n, chunk) } else { codec::add_chunk_into(t, 0, n, chunk) }
                    .map_err(|e| e.to_string()),
            };
            done.map_err(|e| format!("updating key {name}: {e}"))?;
        }
        if let (Some(u), Some(grad)) = (updater, &scratch) {
            let result =
                u.update(&name, weight_mut(self.value_mut(false))?, grad_ref(grad)?).map_err(|e| format!("updating key {name}: {e}"));
            self.scratch = scratch;
            result?;
        }
        Ok(())
    }

    /// The round-sum buffer kept from the last update, if it has `dtype` and the value's
    /// length, else a new one.
    fn take_scratch(&mut self, dtype: DType) -> Buffer {
        let n = self.value.len();
        match self.scratch.take() {
            Some(b) if b.dtype() == dtype && b.len() == n => b,
            _ => Buffer::zeros(dtype, n),
        }
    }

    /// The value for an update to write. In place when no reply holds the value; otherwise a
    /// free spare buffer (or a new one) — a copy of the value unless the update `overwrites`
    /// every element — and the held value becomes the spare.
    fn value_mut(&mut self, overwrites: bool) -> &mut Buffer {
        if Arc::strong_count(&self.value) > 1 {
            let free = self.spare.take().filter(|s| Arc::strong_count(s) == 1 && s.len() == self.value.len());
            let next = match (free, overwrites) {
                (Some(spare), true) => spare,
                (Some(mut spare), false) => {
                    // Unique (checked above): written in place.
                    Arc::make_mut(&mut spare).assign_cast(&self.value);
                    spare
                }
                (None, true) => Arc::new(Buffer::zeros(self.value.dtype(), self.value.len())),
                (None, false) => Arc::new((*self.value).clone()),
            };
            self.spare = Some(std::mem::replace(&mut self.value, next));
        }
        // Unique now (checked or just made), so this never copies.
        Arc::make_mut(&mut self.value)
    }

    /// The whole value (this server's slice) as one chunk, sharing the value's memory.
    pub(super) fn value_chunk(&mut self) -> Chunk {
        Chunk { dtype: codec::dtype_code(self.value.dtype()), data: codec::shared_buffer_bytes(Arc::clone(&self.value)) }
    }

    /// Byte length of the value (this server's slice).
    pub(super) fn byte_len(&self) -> u64 {
        u64::try_from(self.value.len() * self.value.dtype().size_of()).unwrap_or(u64::MAX)
    }

    /// The rows `ids` of a row_sparse key: [ids chunk, rows chunk].
    pub(super) fn rows_chunks(&self, ids_chunk: &Chunk) -> Result<[Chunk; 2], String> {
        let row_len = self.row_len.ok_or_else(|| format!("key {} is dense; use pull, not row_sparse_pull", self.name))?;
        let ids = codec::ids_from_chunk(ids_chunk, self.rows()).map_err(|e| format!("key {}: {e}", self.name))?;
        let mut data = Buffer::zeros(self.value.dtype(), ids.len() * row_len);
        for (i, &id) in ids.iter().enumerate() {
            data.copy_range_from(i * row_len, &self.value, usize::try_from(id).unwrap_or(0) * row_len, row_len);
        }
        Ok([codec::ids_to_chunk(&ids), codec::range_to_chunk(&data, 0, data.len())])
    }
}

fn weight_mut(b: &mut Buffer) -> Result<WeightMut<'_>, String> {
    let dtype = b.dtype();
    match b {
        Buffer::F32(v) => Ok(WeightMut::F32(&mut v[..])),
        Buffer::F64(v) => Ok(WeightMut::F64(&mut v[..])),
        Buffer::F16(v) => Ok(WeightMut::F16(&mut v[..])),
        Buffer::BF16(v) => Ok(WeightMut::BF16(&mut v[..])),
        _ => Err(format!("optimizers update float keys only, this one holds {dtype}")),
    }
}

fn grad_ref(b: &Buffer) -> Result<GradRef<'_>, String> {
    match b {
        Buffer::F32(v) => Ok(GradRef::F32(&v[..])),
        Buffer::F64(v) => Ok(GradRef::F64(&v[..])),
        Buffer::F16(v) => Ok(GradRef::F16(&v[..])),
        Buffer::BF16(v) => Ok(GradRef::BF16(&v[..])),
        other => Err(format!("optimizers update float keys only, got {} gradients", other.dtype())),
    }
}

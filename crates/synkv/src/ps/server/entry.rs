//! [`Entry`]: one key part held by this server — its names, its value, its accumulator and
//! its sync [`Round`] — and the arithmetic of applying a round.
//!
//! An entry is named by [`EntryKey`] = (ps key, offset of the part within the key, in units):
//! a small key is one entry on one server; a big key is cut over the servers, and a part
//! larger than the partition bound is cut further, each part an entry of its own (with its
//! own rounds and optimizer state, kept under [`Entry::state_key`]).
//!
//! Values are validated against the entry (dtype, element count, row ids) before anything
//! changes, so a refused request leaves every entry untouched. Sums are computed in f32 for
//! f16/bf16 keys (in the key's type otherwise) and rounded once when the round completes
//! (spec K6.15's cast-before-summation).
//!
//! **Memory.** The value is shared with the pull replies that carry it (no copy); an update
//! writes in place when no reply holds it any more, else into a spare buffer. Pushes of a
//! round are held as they arrived (their frames' bytes) until the round completes — two
//! workers' pushes are then summed straight into the value in one pass — unless the core's
//! budget of held bytes runs out: then the entry folds them into its accumulator
//! ([`Entry::fold`]), so a round costs the value plus one accumulator, whatever the number
//! of workers.

use std::sync::Arc;

use super::error::ServerError;
use super::round::Round;
use super::value::Value;
use crate::compression::GradientCompression;
use crate::ndarray::{sparse, Buffer, DType, RowSparse, Storage};
use crate::optimizer::{GradRef, LentUpdate, Optimizer, Updater, WeightMut};
use crate::ps::checkpoint::EntryDesc;
use crate::ps::codec::{self, chunk_len, chunk_to_buffer, dtype_of};
use crate::ps::proto::{Chunk, DTypeCode, ErrorCode};
use crate::ps::transport::shm::Broadcast;

/// Values this large or larger live in the server's broadcast segment once a local worker
/// connected (`transport/shm/broadcast.rs`): answers then name them instead of copying.
const SHARED_VALUE_MIN_BYTES: usize = 32 << 10;

/// An entry's name on the wire: (ps key, offset of the part in units).
pub(super) type EntryKey = (u64, u64);

/// A value validated against its entry.
pub(super) enum Checked {
    Dense(Chunk),
    Packed(GradientCompression, Chunk),
    Rows(Vec<i64>, Chunk),
}

/// What a round did to a dense entry, for its replication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Applied {
    /// The value became the sum ([`Entry::value_chunk`] is what to send).
    Assign,
    /// The updater ran on the sum ([`Entry::sum_chunk`] is what to send).
    Update,
}

/// The optimizer a dense round's update runs: the partition's updater, or this entry's
/// update lent out of it ([`Entry::lend`]) to run beside other entries' on other threads.
pub(super) enum Upd<'a> {
    Whole(&'a mut Updater),
    Lent(&'a mut LentUpdate, &'a Optimizer),
}

/// One push of a dense entry, not summed yet: its values, or its packed words.
pub(super) enum Part {
    Raw(Chunk),
    Packed(GradientCompression, Chunk),
}

impl Part {
    /// Bytes of the frame it keeps alive.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Part::Raw(c) | Part::Packed(_, c) => c.data.len(),
        }
    }
}

/// The compute type of sums: f32 for half types, the key's own type otherwise.
fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

fn mismatch(code: ErrorCode, text: String) -> ServerError {
    ServerError::new(code, text)
}

/// One key part held by this server.
pub(super) struct Entry {
    /// The user's name for the key (its display form), for messages and `lr_mult`/`wd_mult`.
    pub(super) name: String,
    /// The name, shared by the entry's trace spans (`ps::trace`).
    pub(super) label: Arc<str>,
    /// The optimizer state's key: the name, or `name@offset` for a part past the first.
    pub(super) state_key: String,
    /// The value, shared with the replies that carry it.
    value: Arc<Buffer>,
    /// A previous value still held by a reply when it was replaced; reused once free.
    spare: Option<Arc<Buffer>>,
    /// `Some(row_len)` for a row_sparse key.
    row_len: Option<usize>,
    /// The accumulator of a round (compute dtype), kept across rounds; shared with a
    /// replication message while that is being sent (see [`Entry::sum_chunk`]).
    scratch: Option<Arc<Buffer>>,
    /// The sync round in progress.
    pub(super) round: Round,
    /// Async mode: the next round id expected from each worker rank.
    pub(super) async_next: Vec<u64>,
    /// Restored from a checkpoint and not yet claimed by an `init` of this run.
    pub(super) restored: bool,
}

impl Entry {
    /// A new entry from its init value.
    pub(super) fn from_init(name: String, offset: u64, value: Value) -> Result<Entry, ServerError> {
        let fail = |e: codec::CodecError| ServerError::invalid(format!("init of key {name}: {e}"));
        let (value, row_len) = match value {
            Value::Packed(..) => return Err(ServerError::invalid("init values travel uncompressed")),
            Value::Dense(chunk) => {
                let dtype = dtype_of(chunk.dtype).map_err(fail)?;
                (chunk_to_buffer(&chunk, dtype).map_err(fail)?, None)
            }
            Value::Rows { ids, data } => {
                let n_ids = chunk_len(&ids);
                let all = codec::ids_from_chunk(&ids, n_ids).map_err(fail)?;
                if all.is_empty() || all.len() != n_ids {
                    return Err(ServerError::invalid(format!(
                        "init of key {name}: a row_sparse key is initialised with every row present (init with empty data is not supported)"
                    )));
                }
                let elems = chunk_len(&data);
                if !elems.is_multiple_of(n_ids) {
                    return Err(ServerError::invalid(format!("init of key {name}: {elems} elements do not split into {n_ids} rows")));
                }
                let dtype = dtype_of(data.dtype).map_err(fail)?;
                (chunk_to_buffer(&data, dtype).map_err(fail)?, Some(elems / n_ids))
            }
        };
        Ok(Entry::new(name, offset, value, row_len))
    }

    fn new(name: String, offset: u64, value: Buffer, row_len: Option<usize>) -> Entry {
        let state_key = if offset == 0 { name.clone() } else { format!("{name}@{offset}") };
        Entry {
            label: Arc::from(name.as_str()),
            name,
            state_key,
            value: Arc::new(value),
            spare: None,
            row_len,
            scratch: None,
            round: Round::default(),
            async_next: Vec::new(),
            restored: false,
        }
    }

    /// An entry restored from a checkpoint: `desc` and its value's bytes. Its rounds start
    /// over (the workers of the restarted job count their pushes from 0).
    pub(super) fn from_checkpoint(desc: &EntryDesc, bytes: &[u8]) -> Result<Entry, ServerError> {
        let bad = |what: String| ServerError::invalid(format!("checkpoint entry {}: {what}", desc.name));
        let dtype: DType = desc.dtype.parse().map_err(|_| bad(format!("dtype {:?}", desc.dtype)))?;
        let len = usize::try_from(desc.len).map_err(|_| bad("too long".into()))?;
        let mut value = Buffer::zeros(dtype, len);
        let dst = codec::buffer_bytes_mut(&mut value);
        if dst.len() != bytes.len() {
            return Err(bad(format!("{} bytes for {len} {dtype} elements", bytes.len())));
        }
        dst.copy_from_slice(bytes);
        let row_len = desc.row_len.map(|r| usize::try_from(r).unwrap_or(usize::MAX));
        let mut entry = Entry::new(desc.name.clone(), desc.offset, value, row_len);
        entry.restored = true;
        Ok(entry)
    }

    /// The entry as a checkpoint describes it (its value is [`Entry::value_bytes`]).
    pub(super) fn desc(&self, key: EntryKey) -> EntryDesc {
        EntryDesc {
            ps: key.0,
            offset: key.1,
            name: self.name.clone(),
            dtype: self.value.dtype().to_string(),
            len: u64::try_from(self.value.len()).unwrap_or(u64::MAX),
            row_len: self.row_len.map(|r| u64::try_from(r).unwrap_or(u64::MAX)),
            round: self.round.id,
        }
    }

    /// The value's element bytes.
    pub(super) fn value_bytes(&self) -> &[u8] {
        codec::buffer_bytes(&self.value)
    }

    /// Whether an `init` value matches this entry: same element type, length and layout. A
    /// restored entry is claimed by the first matching `init` of the new run.
    pub(super) fn matches_init(&self, value: &Value) -> Result<(), ServerError> {
        let (dtype, len, row_len) = match value {
            Value::Dense(c) => (dtype_of(c.dtype).ok(), chunk_len(c), None),
            Value::Rows { ids, data } => (dtype_of(data.dtype).ok(), chunk_len(data), chunk_len(data).checked_div(chunk_len(ids))),
            Value::Packed(..) => (None, 0, None),
        };
        if dtype != Some(self.value.dtype()) || len != self.value.len() || row_len != self.row_len {
            return Err(ServerError::new(
                ErrorCode::ShapeMismatch,
                format!(
                    "the checkpoint holds key {} as {} {} elements here, but init gives {len} {} (restart with the same model, or with another SYNKV_CHECKPOINT_DIR)",
                    self.name,
                    self.value.len(),
                    self.value.dtype(),
                    dtype.map_or_else(|| "non-float".to_owned(), |d| d.to_string())
                ),
            ));
        }
        Ok(())
    }

    fn rows(&self) -> usize {
        self.row_len.map_or(1, |r| self.value.len().checked_div(r).unwrap_or(0))
    }

    /// Whether the entry is a row_sparse key's part.
    pub(super) fn is_rows(&self) -> bool {
        self.row_len.is_some()
    }

    /// Validates a pushed value against this entry.
    pub(super) fn check(&self, value: Value) -> Result<Checked, ServerError> {
        let dtype = self.value.dtype();
        match (value, self.row_len) {
            (Value::Dense(chunk), None) => {
                if dtype_of(chunk.dtype).ok() != Some(dtype) {
                    return Err(mismatch(
                        ErrorCode::DTypeMismatch,
                        format!("key {} holds {dtype} values, got {:?}", self.name, chunk.dtype),
                    ));
                }
                if chunk_len(&chunk) != self.value.len() {
                    let text = format!(
                        "key {} holds {} elements here, got {} (the size of a key cannot change)",
                        self.name,
                        self.value.len(),
                        chunk_len(&chunk)
                    );
                    return Err(mismatch(ErrorCode::ShapeMismatch, text));
                }
                Ok(Checked::Dense(chunk))
            }
            (Value::Rows { ids, data }, Some(row_len)) => {
                let ids = codec::ids_from_chunk(&ids, self.rows()).map_err(|e| ServerError::invalid(format!("key {}: {e}", self.name)))?;
                if dtype_of(data.dtype).ok() != Some(dtype) {
                    return Err(mismatch(
                        ErrorCode::DTypeMismatch,
                        format!("key {} holds {dtype} values, got {:?}", self.name, data.dtype),
                    ));
                }
                if chunk_len(&data) != ids.len() * row_len {
                    let text = format!(
                        "key {}: {} rows of {row_len} need {} elements, got {}",
                        self.name,
                        ids.len(),
                        ids.len() * row_len,
                        chunk_len(&data)
                    );
                    return Err(mismatch(ErrorCode::ShapeMismatch, text));
                }
                Ok(Checked::Rows(ids, data))
            }
            (Value::Packed(gc, words), None) => {
                if dtype != DType::F32 {
                    let text = format!("key {} holds {dtype} values; compressed pushes carry float32 gradients only", self.name);
                    return Err(mismatch(ErrorCode::DTypeMismatch, text));
                }
                let expected = gc.compressed_len(self.value.len());
                if words.dtype != DTypeCode::U32 || chunk_len(&words) != expected {
                    let text = format!(
                        "key {}: {} elements here need {expected} packed {} words, got {} {:?} elements (workers must split keys alike: set gradient compression before init on every worker)",
                        self.name,
                        self.value.len(),
                        gc.kind(),
                        chunk_len(&words),
                        words.dtype
                    );
                    return Err(mismatch(ErrorCode::ShapeMismatch, text));
                }
                Ok(Checked::Packed(gc, words))
            }
            (Value::Dense(_) | Value::Packed(..), Some(_)) => {
                Err(mismatch(ErrorCode::StorageMismatch, format!("key {} is row_sparse; push row_sparse values to it", self.name)))
            }
            (Value::Rows { .. }, None) => {
                Err(mismatch(ErrorCode::StorageMismatch, format!("key {} is dense; row_sparse values cannot be pushed to it", self.name)))
            }
        }
    }

    /// A row_sparse push as rows in the compute dtype (a copy: rows are summed at the end).
    pub(super) fn rows_of(&self, ids: Vec<i64>, data: &Chunk) -> Result<RowSparse, ServerError> {
        let data = chunk_to_buffer(data, compute_dtype(self.value.dtype()))
            .map_err(|e| ServerError::invalid(format!("key {}: {e}", self.name)))?;
        Ok(RowSparse { indices: ids, data })
    }

    /// Folds `parts` into the accumulator: the first part of a round (`first`) overwrites
    /// it, later ones add. Frees the parts' frames.
    pub(super) fn fold(&mut self, parts: Vec<Part>, first: bool) -> Result<(), ServerError> {
        let cdt = compute_dtype(self.value.dtype());
        let mut acc = self.take_scratch(cdt, !first);
        let result = add_parts(&mut acc, &parts, first).map_err(|e| ServerError::invalid(format!("updating key {}: {e}", self.name)));
        self.scratch = Some(Arc::new(acc));
        result
    }

    /// Applies a round of dense pushes: `held` (not summed yet) plus, if `accumulated`, the
    /// accumulator; then the updater, or `value := sum` without one. A backup copy applies the
    /// same function to the one part its primary sends (the sum, or the new value), which
    /// gives the same bits.
    pub(super) fn finish_dense(
        &mut self,
        held: Vec<Part>,
        accumulated: bool,
        updater: Option<Upd<'_>>,
        on_sum: Option<&mut dyn FnMut(Chunk)>,
        shared: Option<&Arc<Broadcast>>,
    ) -> Result<Applied, ServerError> {
        let dtype = self.value.dtype();
        let cdt = compute_dtype(dtype);
        let codec_fail = |name: &str, e: String| ServerError::invalid(format!("updating key {name}: {e}"));
        if !accumulated && updater.is_none() && cdt == dtype && held.iter().all(|p| matches!(p, Part::Raw(_))) {
            // Assign: the pushes are summed straight into the value in one pass.
            let chunks: Vec<Chunk> = held.into_iter().filter_map(|p| if let Part::Raw(c) = p { Some(c) } else { None }).collect();
            let name = self.name.clone();
            return codec::sum_chunks_into(self.value_mut(true, shared), &chunks)
                .map(|()| Applied::Assign)
                .map_err(|e| codec_fail(&name, e.to_string()));
        }
        let mut acc = self.take_scratch(cdt, accumulated);
        if let Err(e) = add_parts(&mut acc, &held, !accumulated) {
            self.scratch = Some(Arc::new(acc));
            return Err(codec_fail(&self.name, e));
        }
        drop(held);
        let result = match updater {
            None if cdt == dtype => {
                // The accumulator becomes the value, the old value the next accumulator; a
                // value in shared memory stays there (the sum is copied in).
                let value = self.value_mut(true, shared);
                if value.is_external() {
                    value.assign_cast(&acc);
                } else {
                    std::mem::swap(value, &mut acc);
                }
                Ok(Applied::Assign)
            }
            None => {
                self.value_mut(true, shared).assign_cast(&acc);
                Ok(Applied::Assign)
            }
            Some(u) => {
                let acc = Arc::new(acc);
                // The sum goes out (to the backup copy) while the update runs.
                if let Some(f) = on_sum {
                    f(Chunk { dtype: codec::dtype_code(cdt), data: codec::shared_buffer_bytes(Arc::clone(&acc)) });
                }
                let cast;
                let grad = if cdt == dtype {
                    &*acc
                } else {
                    cast = acc.cast(dtype);
                    &cast
                };
                let (name, state_key) = (self.name.clone(), self.state_key.clone());
                let result = match (weight_mut(self.value_mut(false, shared)), grad_ref(grad)) {
                    (Ok(w), Ok(g)) => match u {
                        Upd::Whole(u) => u.update_as(&name, &state_key, w, g),
                        Upd::Lent(lent, opt) => lent.apply(opt, w, g),
                    }
                    .map(|()| Applied::Update)
                    .map_err(|e| optimizer_error(&name, e)),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                };
                self.scratch = Some(acc);
                return result;
            }
        };
        self.scratch = Some(Arc::new(acc));
        result
    }

    /// Takes this dense entry's next update out of `u` ([`Updater::lend`]), to run with
    /// [`Upd::Lent`] beside other entries' updates.
    pub(super) fn lend(&self, u: &mut Updater) -> Result<LentUpdate, ServerError> {
        let elem = GradRef::of(&self.value).map(|g| g.elem_type()).ok_or_else(|| {
            ServerError::new(ErrorCode::DTypeMismatch, format!("optimizers update float keys only, this one holds {}", self.value.dtype()))
        })?;
        let master = || self.value.cast(DType::F32).to_vec::<f32>();
        u.lend(&self.name, &self.state_key, elem, self.value.len(), master).map_err(|e| optimizer_error(&self.name, e))
    }

    /// Applies a round of row_sparse pushes: the updater on their sum, or `value := sum`
    /// (rows absent from the sum become zero) without one. With `keep`, returns the sum (in
    /// the compute dtype) for the backup copy, which applies it as the one part of a round.
    pub(super) fn finish_rows(
        &mut self,
        parts: Vec<RowSparse>,
        updater: Option<&mut Updater>,
        keep: bool,
    ) -> Result<Option<RowSparse>, ServerError> {
        let dtype = self.value.dtype();
        let row_len = self.row_len.unwrap_or(1);
        let rows = self.rows();
        let storages: Vec<Storage> = parts.into_iter().map(Storage::RowSparse).collect();
        let refs: Vec<&Storage> = storages.iter().collect();
        let sum = sparse::sum_row_sparse(&refs, rows, row_len, compute_dtype(dtype));
        let kept = keep.then(|| sum.clone());
        let data = if sum.data.dtype() == dtype { sum.data } else { sum.data.cast(dtype) };
        match updater {
            None => {
                let len = self.value.len();
                let value = self.value_mut(true, None);
                *value = Buffer::zeros(dtype, len);
                for (i, &id) in sum.indices.iter().enumerate() {
                    let id = usize::try_from(id).unwrap_or(0);
                    value.copy_range_from(id * row_len, &data, i * row_len, row_len);
                }
                Ok(kept)
            }
            Some(u) => {
                let (name, state_key) = (self.name.clone(), self.state_key.clone());
                let w = weight_mut(self.value_mut(false, None))?;
                u.update_row_sparse_as(&name, &state_key, w, row_len, &sum.indices, grad_ref(&data)?)
                    .map(|()| kept)
                    .map_err(|e| optimizer_error(&name, e))
            }
        }
    }

    /// The value's dtype and the dtype sums are computed in.
    pub(super) fn dtypes(&self) -> (DType, DType) {
        let dtype = self.value.dtype();
        (dtype, compute_dtype(dtype))
    }

    /// The accumulator kept from the last round, if it has `dtype` and the value's length,
    /// else a new one; `contents`: whether the caller adds to what it holds.
    fn take_scratch(&mut self, dtype: DType, contents: bool) -> Buffer {
        let n = self.value.len();
        match self.scratch.take() {
            // Still shared with a replication message being sent: its contents (a round
            // in progress needs them) in a buffer of its own.
            Some(b) if b.dtype() == dtype && b.len() == n => match Arc::try_unwrap(b) {
                Ok(own) => own,
                Err(shared) if contents => (*shared).clone(),
                Err(_) => Buffer::zeros(dtype, n),
            },
            _ => Buffer::zeros(dtype, n),
        }
    }

    /// The value for an update to write. In place when no reply holds the value; otherwise a
    /// free spare buffer (or a new one) — a copy of the value unless the update `overwrites`
    /// every element — and the held value becomes the spare.
    fn value_mut(&mut self, overwrites: bool, shared: Option<&Arc<Broadcast>>) -> &mut Buffer {
        let (dtype, len) = (self.value.dtype(), self.value.len());
        let bytes = len * dtype.size_of();
        // A large value lives in the broadcast segment, where answers read it in place.
        let shared = shared.filter(|_| bytes >= SHARED_VALUE_MIN_BYTES);
        let held = Arc::strong_count(&self.value) > 1;
        let moves = shared.is_some() && !self.value.is_external();
        if held || moves {
            let fits = |s: &Arc<Buffer>| Arc::strong_count(s) == 1 && s.len() == len && (shared.is_none() || s.is_external());
            let free = self.spare.take().filter(fits);
            let fresh = || shared.and_then(|b| b.alloc_value(bytes)).and_then(|slot| slot.into_buffer(dtype, len)).map(Arc::new);
            let next = match (free.or_else(fresh), overwrites) {
                (Some(next), true) => Some(next),
                (Some(mut next), false) => {
                    // Unique (checked or just made): written in place.
                    Arc::make_mut(&mut next).assign_cast(&self.value);
                    Some(next)
                }
                (None, true) if held => Some(Arc::new(Buffer::zeros(dtype, len))),
                (None, false) if held => Some(Arc::new((*self.value).clone())),
                // Not held, and no room in shared memory: stays where it is.
                (None, _) => None,
            };
            if let Some(next) = next {
                self.spare = Some(std::mem::replace(&mut self.value, next));
            }
        }
        // Unique now (checked or just made), so this never copies.
        Arc::make_mut(&mut self.value)
    }

    /// The whole value as one chunk, sharing the value's memory.
    pub(super) fn value_chunk(&self) -> Chunk {
        Chunk { dtype: codec::dtype_code(self.value.dtype()), data: codec::shared_buffer_bytes(Arc::clone(&self.value)) }
    }

    /// Byte length of the value.
    pub(super) fn byte_len(&self) -> u64 {
        u64::try_from(self.value.len() * self.value.dtype().size_of()).unwrap_or(u64::MAX)
    }

    /// The rows `ids` of a row_sparse entry: [ids chunk, rows chunk].
    pub(super) fn rows_chunks(&self, ids_chunk: &Chunk) -> Result<[Chunk; 2], ServerError> {
        let row_len = self.row_len.ok_or_else(|| {
            ServerError::new(ErrorCode::StorageMismatch, format!("key {} is dense; use pull, not row_sparse_pull", self.name))
        })?;
        let ids = codec::ids_from_chunk(ids_chunk, self.rows()).map_err(|e| ServerError::invalid(format!("key {}: {e}", self.name)))?;
        let mut data = Buffer::zeros(self.value.dtype(), ids.len() * row_len);
        for (i, &id) in ids.iter().enumerate() {
            data.copy_range_from(i * row_len, &self.value, usize::try_from(id).unwrap_or(0) * row_len, row_len);
        }
        Ok([codec::ids_to_chunk(&ids), codec::range_to_chunk(&data, 0, data.len())])
    }
}

/// `acc (=|+=) Σ parts`: the first part overwrites when `first`, every other one adds;
/// packed words are dequantized on the way (spec K7.10).
fn add_parts(acc: &mut Buffer, parts: &[Part], first: bool) -> Result<(), String> {
    let n = acc.len();
    if first && parts.len() > 1 && parts.iter().all(|p| matches!(p, Part::Raw(c) if dtype_of(c.dtype).ok() == Some(acc.dtype()))) {
        let chunks: Vec<Chunk> = parts.iter().filter_map(|p| if let Part::Raw(c) = p { Some(c.clone()) } else { None }).collect();
        return codec::sum_chunks_into(acc, &chunks).map_err(|e| e.to_string());
    }
    for (i, part) in parts.iter().enumerate() {
        let overwrite = first && i == 0;
        match (part, &mut *acc) {
            (Part::Packed(gc, words), Buffer::F32(v)) => {
                let words = codec::words_of(words).map_err(|e| e.to_string())?;
                if overwrite { gc.dequantize(&words, n, v) } else { gc.dequantize_add(&words, n, v) }.map_err(|e| e.to_string())?;
            }
            (Part::Packed(..), other) => {
                return Err(format!("it holds {} values; compressed pushes carry float32 gradients only", other.dtype()))
            }
            (Part::Raw(chunk), t) => if overwrite { codec::copy_chunk_into(t, 0, n, chunk) } else { codec::add_chunk_into(t, 0, n, chunk) }
                .map_err(|e| e.to_string())?,
        }
    }
    Ok(())
}

fn optimizer_error(name: &str, e: crate::optimizer::Error) -> ServerError {
    ServerError::new(ErrorCode::Optimizer, format!("updating key {name}: {e}"))
}

fn weight_mut(b: &mut Buffer) -> Result<WeightMut<'_>, ServerError> {
    let dtype = b.dtype();
    WeightMut::of(b)
        .ok_or_else(|| ServerError::new(ErrorCode::DTypeMismatch, format!("optimizers update float keys only, this one holds {dtype}")))
}

fn grad_ref(b: &Buffer) -> Result<GradRef<'_>, ServerError> {
    GradRef::of(b).ok_or_else(|| {
        ServerError::new(ErrorCode::DTypeMismatch, format!("optimizers update float keys only, got {} gradients", b.dtype()))
    })
}

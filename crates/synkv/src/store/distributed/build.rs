//! Building the messages of an operation: per-device values summed into one communication
//! buffer (a copy: the caller's array is never aliased, spec K12.1), cut into the key's parts
//! (zero-copy `Bytes` slices), and packed into messages cut by keys, chunks and bytes.
//!
//! Every part of a key (a server's slice, or a piece of one larger than the partition bound)
//! is one entry on its server, named by (ps key, offset); a push carries each part's round id
//! (the number of this worker's accepted pushes of it). Parts of one call going to one server
//! share messages, and a message is closed once it holds the frame's key or chunk limit or
//! [`Budget::bytes`] of data, so any number of keys and any value size travel — a part larger
//! than the budget goes alone. A row_sparse pull is cut by the size of the rows it asks for,
//! since its reply is larger than its request.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use super::keys::KeyInfo;
use super::ops::{Item, Kind};
use crate::compression::GradientCompression;
use crate::engine::Priority;
use crate::ndarray::{lend_bytes, sparse, Buffer, RowSparse, Storage};
use crate::ps::codec;
use crate::ps::proto::{Chunk, Command, DTypeCode, Flags, Limits, Message};
use crate::StorageType;

/// Wire bytes a key costs in a message besides its data (key, length, offset and round id,
/// chunk lengths and dtypes, padding).
const PER_KEY: usize = 64;

/// How large one message may grow.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// Data bytes (plus [`PER_KEY`] per key) before a message is closed.
    pub(crate) bytes: usize,
    /// Keys per message (below the frame limit).
    pub(crate) keys: usize,
    /// Chunks per message (below the frame limit).
    pub(crate) chunks: usize,
}

impl Budget {
    /// The budget of a cluster with partitions of `partition_bytes` and frames `limits`.
    pub(crate) fn new(partition_bytes: u64, limits: &Limits) -> Budget {
        let limit = |v: u32| usize::try_from(v).unwrap_or(usize::MAX).saturating_sub(16).max(2);
        Budget {
            bytes: usize::try_from(partition_bytes).unwrap_or(usize::MAX),
            keys: limit(limits.max_keys),
            chunks: limit(limits.max_chunks),
        }
    }
}

/// Where each key of a message goes back to: (item, index of the part in the key's slices,
/// first requested row).
pub(crate) type Places = Vec<(usize, usize, usize)>;

/// What keeps a push's arrays readable while their memory is lent to the writer (the engine's
/// [`ReadLease`](crate::engine::ReadLease) of the operation).
pub(crate) type Lease = Arc<dyn std::any::Any + Send + Sync>;

/// An operation's messages (with their servers) and, per message, where its keys go back to.
pub(crate) type Built = (Vec<(u32, Message)>, Vec<Places>);

/// A message under construction.
struct Open {
    server: u32,
    rows: bool,
    /// A push that asks for its values back (`held.rs`).
    back: bool,
    msg: Message,
    places: Places,
    bytes: usize,
    /// Chunks of the message or of its answer, whichever has more.
    chunks: usize,
}

/// Where a key part comes from: the item, its info, the part's index in the key's slices, its
/// first requested row (row_sparse pulls), whether it travels as rows, and whether it is
/// pushed asking for its value back.
struct At<'a> {
    item: usize,
    info: &'a KeyInfo,
    part: usize,
    start: usize,
    rows: bool,
    back: bool,
}

/// Messages under construction: per (server, dense|rows, asking back), the one still open.
struct Builder {
    command: Command,
    priority: Priority,
    /// Set for a compressed push.
    compression: Option<GradientCompression>,
    /// Whether keys carry round ids (pushes).
    rounds: bool,
    budget: Budget,
    msgs: Vec<Open>,
}

impl Builder {
    /// The open message for (server, rows, back) with room for `keys` keys, `chunks` chunks
    /// and `bytes` bytes, or a new one.
    fn slot(&mut self, server: u32, rows: bool, back: bool, keys: usize, chunks: usize, bytes: usize) -> &mut Open {
        let b = self.budget;
        let fits = |o: &Open| o.msg.meta.keys.len() + keys <= b.keys && o.chunks + chunks <= b.chunks && o.bytes + bytes <= b.bytes;
        let pos = self.msgs.iter().rposition(|o| o.server == server && o.rows == rows && o.back == back);
        let i = match pos {
            Some(i) if fits(&self.msgs[i]) => i,
            _ => {
                let command = if back && self.command == Command::Push { Command::PushPull } else { self.command };
                let mut m = Message::new(command);
                m.meta.priority = self.priority;
                if rows {
                    m.flags = Flags::ROW_SPARSE;
                }
                if let Some(gc) = &self.compression {
                    // The configuration travels with the words: servers need no setup and can
                    // never dequantize with another worker's parameters.
                    m.flags = m.flags.with(Flags::COMPRESSED);
                    m.meta.text = serde_json::to_string(gc).unwrap_or_default();
                }
                self.msgs.push(Open { server, rows, back, msg: m, places: Vec::new(), bytes: 0, chunks: 0 });
                self.msgs.len() - 1
            }
        };
        &mut self.msgs[i]
    }

    /// Adds a key part (its `len` bytes of value, its chunks) to a message, where it weighs
    /// `reply` bytes besides its chunks (what its answer carries).
    fn add(&mut self, at: At<'_>, len: u64, chunks: SmallVec<[Chunk; 2]>, reply: usize) {
        let At { item: i, info, part, start, rows, back } = at;
        let slice = info.slices[part];
        let data: usize = chunks.iter().map(|c| c.data.len()).sum();
        let bytes = data + reply + PER_KEY;
        let round = self.rounds.then(|| info.rounds[part].load(Ordering::Acquire));
        // The answer has chunks too: one per key (values), two for rows (ids and rows).
        let answer_chunks = match self.command {
            Command::Push if !back => 0,
            _ if rows => 2,
            _ => 1,
        };
        let weight = chunks.len().max(answer_chunks);
        let open = self.slot(slice.server, rows, back, 1, weight, bytes);
        open.chunks += weight;
        let m = &mut open.msg;
        m.meta.push_key(info.ps, len, u64::try_from(slice.offset).unwrap_or(u64::MAX));
        if let Some(r) = round {
            m.meta.rounds.push(r);
        }
        m.chunks.extend(chunks);
        open.places.push((i, part, start));
        open.bytes += bytes;
    }
}

fn byte_len(chunks: &[Chunk]) -> u64 {
    chunks.iter().map(|c| u64::try_from(c.data.len()).unwrap_or(u64::MAX)).sum()
}

/// The communication bytes of a dense key's push: a single value lent as it is (with a
/// `lease`: no copy, the caller's memory goes to the writer), or one copy of it (into the
/// key's reused buffer), or the sum of several handed over without another copy. For an item
/// of one part, the bytes of that part alone; otherwise the whole key's.
fn dense_bytes(item: &Item, lease: Option<&Lease>) -> Option<Bytes> {
    let info = &item.info;
    if let [one] = item.inputs.as_slice() {
        let es = info.dtype.size_of();
        let range = match item.part {
            Some(p) => info.slices.get(p).map(|s| s.offset * es..(s.offset + s.len) * es)?,
            None => 0..info.shape.size() * es,
        };
        if let Some(lease) = lease.filter(|_| one.dtype() == info.dtype) {
            if let Some(lent) = lend_bytes(one, range.clone(), Arc::clone(lease)) {
                return Some(lent);
            }
        }
        let guard = one.storage();
        if let Some(b) = guard.dense().filter(|b| b.dtype() == info.dtype) {
            let all = codec::buffer_bytes(b);
            let spare = info.spares.get(item.part.unwrap_or(0))?;
            let src = all.get(range)?;
            let mut spare = spare.lock();
            let bytes = codec::copy_reusing(src, spare.take());
            *spare = Some(bytes.clone());
            return Some(bytes);
        }
    }
    match merged(item) {
        Storage::Dense(buf) => Some(codec::buffer_into_bytes(buf)),
        _ => None,
    }
}

/// The sum of a key's pushed values, as the key's storage type.
pub(crate) fn merged(item: &Item) -> Storage {
    let info = &item.info;
    let guards: SmallVec<[_; 4]> = item.inputs.iter().map(|a| a.storage()).collect();
    if info.stype == StorageType::RowSparse {
        let parts: Vec<&Storage> = guards.iter().map(|g| &**g).collect();
        return Storage::RowSparse(sparse::sum_row_sparse(&parts, info.shape.rows(), info.shape.row_len(), info.dtype));
    }
    let dense: Vec<Buffer>;
    let srcs: Vec<&Buffer> = if guards.iter().all(|g| g.storage_type() == StorageType::Dense) {
        guards.iter().filter_map(|g| g.dense()).collect()
    } else {
        dense = guards.iter().map(|g| g.to_dense_buffer(info.shape.rows(), info.shape.row_len())).collect();
        dense.iter().collect()
    };
    let mut out = Buffer::zeros(info.dtype, info.shape.size());
    if !srcs.is_empty() {
        out.assign_sum(&srcs);
    }
    Storage::Dense(out)
}

/// Quantizes a dense f32 key's pushed value (the one input in place, or the sum of several)
/// with the key's residual, part by part, into one buffer of packed words; returns each
/// part's words as zero-copy `Bytes`.
///
/// A key split in units of words (K7.11) gives exactly the words of quantizing it whole; a
/// key whose parts end inside a word (K8.8 boundaries, or pieces) gets each part's words
/// separately, with the same values.
fn packed_bytes(item: &Item, gc: &GradientCompression) -> crate::Result<Vec<Bytes>> {
    let info = &item.info;
    let n = info.shape.size();
    let merged_sum;
    let guard;
    let grad: &[f32] = match item.inputs.as_slice() {
        [one] => {
            guard = one.storage();
            match guard.dense() {
                Some(Buffer::F32(v)) => &v[..],
                _ => &[],
            }
        }
        _ => {
            merged_sum = merged(item);
            match &merged_sum {
                Storage::Dense(Buffer::F32(v)) => &v[..],
                _ => &[],
            }
        }
    };
    if grad.len() != n {
        return Err(crate::store::Error::Unsupported {
            op: "push",
            store_type: "dist".into(),
            reason: format!("gradient compression applies to dense float32 values only; key {} got another value", info.key),
        }
        .into());
    }
    let words: usize = info.slices.iter().map(|s| gc.compressed_len(s.len)).sum();
    let mut buf = {
        let mut spare = info.packing.spare.lock();
        match spare.take() {
            Some(arc) if Arc::strong_count(&arc) == 1 => arc,
            _ => Arc::new(Vec::new()),
        }
    };
    let residual = info.packing.residual.get_or_init(|| crate::compression::Residual::zeros(n));
    let mut ranges = Vec::with_capacity(info.slices.len());
    {
        // The allocation is ours alone (no other handle, checked above), so this does not copy.
        let out = Arc::make_mut(&mut buf);
        out.clear();
        out.resize(words, 0);
        let mut res = residual.lock();
        let mut at = 0;
        for s in &info.slices {
            let w = gc.compressed_len(s.len);
            let range = s.offset..s.offset + s.len;
            gc.quantize(&grad[range.clone()], &mut res[range], &mut out[at..at + w])?;
            ranges.push(at * 4..(at + w) * 4);
            at += w;
        }
    }
    *info.packing.spare.lock() = Some(Arc::clone(&buf));
    let bytes = codec::words_into_bytes(buf);
    Ok(ranges.into_iter().map(|r| bytes.slice(r)).collect())
}

/// Builds the messages of an operation.
#[cfg(test)]
pub(crate) fn build(
    kind: Kind,
    items: &[Item],
    priority: Priority,
    compression: Option<&GradientCompression>,
    budget: Budget,
    lease: Option<&Lease>,
) -> crate::Result<Built> {
    build_with(kind, &[], items, priority, compression, budget, lease)
}

/// Builds the messages of an operation; a push of the items `back` marks asks for their
/// values back (`PushPull` on the wire, in messages of their own, answers weighed as a
/// pushpull's: `held.rs`).
pub(crate) fn build_with(
    kind: Kind,
    back: &[bool],
    items: &[Item],
    priority: Priority,
    compression: Option<&GradientCompression>,
    budget: Budget,
    lease: Option<&Lease>,
) -> crate::Result<Built> {
    let command = match kind {
        Kind::Push => Command::Push,
        Kind::PushPull => Command::PushPull,
        Kind::Pull | Kind::RowSparsePull => Command::Pull,
    };
    let pushing = matches!(kind, Kind::Push | Kind::PushPull);
    let compression = compression.filter(|_| pushing).copied();
    let mut b = Builder { command, priority, compression, rounds: pushing, budget, msgs: Vec::new() };
    for (i, item) in items.iter().enumerate() {
        let info = &*item.info;
        let es = info.dtype.size_of();
        let unit = info.unit();
        // Whether this item's answer carries its values.
        let back = kind == Kind::PushPull || (kind == Kind::Push && back.get(i).copied().unwrap_or(false));
        match kind {
            Kind::Push | Kind::PushPull if info.stype == StorageType::Dense && compression.is_some() => {
                let Some(gc) = &compression else { continue };
                for (part, data) in packed_bytes(item, gc)?.into_iter().enumerate() {
                    let chunk = Chunk { dtype: DTypeCode::U32, data };
                    let reply = if back { info.slices[part].len * unit * es } else { 0 };
                    b.add(
                        At { item: i, info, part, start: 0, rows: false, back },
                        byte_len(std::slice::from_ref(&chunk)),
                        smallvec::smallvec![chunk],
                        reply,
                    );
                }
            }
            Kind::Push | Kind::PushPull if info.stype == StorageType::Dense => {
                let bytes = dense_bytes(item, lease).unwrap_or_default();
                // The bytes start at the first part this item moves.
                let base = info.slices.get(item.parts().start).map_or(0, |s| s.offset);
                for part in item.parts() {
                    let Some(s) = info.slices.get(part) else { continue };
                    let range = (s.offset - base) * unit * es..(s.offset - base + s.len) * unit * es;
                    // The bytes hold the item's parts (the shape was checked); never slice past them.
                    let data = if range.end <= bytes.len() { bytes.slice(range) } else { Bytes::new() };
                    let chunk = Chunk { dtype: codec::dtype_code(info.dtype), data };
                    let reply = if back { chunk.data.len() } else { 0 };
                    b.add(
                        At { item: i, info, part, start: 0, rows: false, back },
                        byte_len(std::slice::from_ref(&chunk)),
                        smallvec::smallvec![chunk],
                        reply,
                    );
                }
            }
            Kind::Push | Kind::PushPull => {
                if let Storage::RowSparse(rs) = merged(item) {
                    add_rows(&mut b, i, info, &rs);
                }
            }
            Kind::Pull => {
                for part in item.parts() {
                    let Some(s) = info.slices.get(part) else { continue };
                    // The reply carries the value: its bytes count against the budget.
                    let len = s.len * unit * es;
                    b.add(
                        At { item: i, info, part, start: 0, rows: false, back: false },
                        u64::try_from(len).unwrap_or(u64::MAX),
                        SmallVec::new(),
                        len,
                    );
                }
            }
            Kind::RowSparsePull => add_row_requests(&mut b, i, info, &item.ids),
        }
    }
    let mut msgs = Vec::with_capacity(b.msgs.len());
    let mut places = Vec::with_capacity(b.msgs.len());
    for o in b.msgs {
        msgs.push((o.server, o.msg));
        places.push(o.places);
    }
    Ok((msgs, places))
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Asks the servers holding them for the rows `ids` (sorted, unique) of a row_sparse key, ids
/// relative to each part; a part's ids are cut so that each reply (ids and rows) fits the
/// budget.
fn add_row_requests(b: &mut Builder, i: usize, info: &KeyInfo, ids: &[i64]) {
    let row_bytes = 8 + info.shape.row_len() * info.dtype.size_of();
    let per_request = (b.budget.bytes / row_bytes).max(1);
    let mut start = 0usize;
    for (part, s) in info.slices.iter().enumerate() {
        let (lo, hi) = (to_i64(s.offset), to_i64(s.offset + s.len));
        let n = ids[start..].iter().take_while(|&&id| id < hi).count();
        for (k, chunk_ids) in ids[start..start + n].chunks(per_request).enumerate() {
            let rel: Vec<i64> = chunk_ids.iter().map(|id| id - lo).collect();
            let chunk = codec::ids_to_chunk(&rel);
            let reply = chunk_ids.len() * row_bytes;
            let at = At { item: i, info, part, start: start + k * per_request, rows: true, back: false };
            b.add(at, byte_len(std::slice::from_ref(&chunk)), smallvec::smallvec![chunk], reply);
        }
        start += n;
    }
}

/// Adds a row_sparse value's rows to the messages of the servers holding them (ids relative
/// to each part). Every part gets its key, even with no rows, so every server counts this
/// worker's push in its round.
fn add_rows(b: &mut Builder, i: usize, info: &KeyInfo, rs: &RowSparse) {
    let row_len = info.shape.row_len();
    let mut start = 0usize;
    for (part, s) in info.slices.iter().enumerate() {
        let (lo, hi) = (to_i64(s.offset), to_i64(s.offset + s.len));
        let n = rs.indices[start..].iter().take_while(|&&id| id < hi).count();
        let rel: Vec<i64> = rs.indices[start..start + n].iter().map(|id| id - lo).collect();
        let ids = codec::ids_to_chunk(&rel);
        let data = codec::range_to_chunk(&rs.data, start * row_len, n * row_len);
        let chunks: SmallVec<[Chunk; 2]> = smallvec::smallvec![ids, data];
        b.add(At { item: i, info, part, start, rows: true, back: false }, byte_len(&chunks), chunks, 0);
        start += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::codec::chunk_len;
    use crate::ps::slicer::{self, Slice};
    use crate::store::distributed::keys::KeyInfo;
    use crate::store::Key;
    use crate::{Context, DType, NDArray, Shape};

    const BUDGET: Budget = Budget { bytes: 1 << 30, keys: 1 << 20, chunks: 1 << 16 };

    fn rows_key(rows: usize, row_len: usize) -> Arc<KeyInfo> {
        let ps = slicer::str_key("emb");
        Arc::new(KeyInfo::for_test(
            Key::from("emb"),
            Shape::from(vec![rows, row_len]),
            DType::F32,
            StorageType::RowSparse,
            slicer::slices(ps, rows, row_len, 2, 100),
        ))
    }

    #[test]
    fn only_touched_rows_travel_with_ids_relative_to_each_slice() {
        let info = rows_key(1000, 4);
        assert_eq!(info.slices.len(), 2);
        let value = NDArray::row_sparse([1000, 4], vec![3, 600], Buffer::from_vec(vec![1.0f32; 8]), Context::cpu(0)).unwrap();
        let item = Item { info: Arc::clone(&info), inputs: smallvec::smallvec![value], outs: SmallVec::new(), ids: Vec::new(), part: None };
        let (msgs, places) = build(Kind::Push, &[item], 0, None, BUDGET, None).unwrap();
        assert_eq!(msgs.len(), 2);
        for ((server, m), place) in msgs.iter().zip(&places) {
            assert!(m.flags.contains(Flags::ROW_SPARSE));
            let ids = codec::ids_from_chunk(&m.chunks[0], 500).unwrap();
            assert_eq!(ids, if *server == 0 { vec![3] } else { vec![100] });
            assert_eq!(chunk_len(&m.chunks[1]), 4, "one row of 4 elements, not the whole key");
            assert_eq!(place.len(), 1);
        }
        let pull = Item { info, inputs: SmallVec::new(), outs: SmallVec::new(), ids: vec![1, 2, 999], part: None };
        let (msgs, places) = build(Kind::RowSparsePull, &[pull], 0, None, BUDGET, None).unwrap();
        let asked: Vec<(u32, Vec<i64>)> = msgs.iter().map(|(s, m)| (*s, codec::ids_from_chunk(&m.chunks[0], 500).unwrap())).collect();
        assert_eq!(asked, vec![(0, vec![1, 2]), (1, vec![499])]);
        assert_eq!(places[1][0].2, 2, "server 1's rows start at position 2 of the output");
    }

    #[test]
    fn small_keys_of_a_call_share_one_message_per_server() {
        let keys: Vec<Arc<KeyInfo>> = (0..100)
            .map(|k| {
                let ps = slicer::int_key(k);
                Arc::new(KeyInfo::for_test(
                    Key::Int(k),
                    Shape::from(vec![10]),
                    DType::F32,
                    StorageType::Dense,
                    slicer::slices(ps, 10, 1, 2, 1000),
                ))
            })
            .collect();
        let items: Vec<Item> = keys
            .iter()
            .map(|info| Item {
                info: Arc::clone(info),
                inputs: smallvec::smallvec![NDArray::ones([10])],
                outs: SmallVec::new(),
                ids: Vec::new(),
                part: None,
            })
            .collect();
        let batches = super::super::ops::batches(items);
        assert_eq!(batches.len(), 1);
        let (msgs, _) = build(Kind::Push, &batches[0], 0, None, BUDGET, None).unwrap();
        assert_eq!(msgs.len(), 2, "one message per server");
        assert_eq!(msgs.iter().map(|(_, m)| m.meta.keys.len()).sum::<usize>(), 100);
    }

    #[test]
    fn a_compressed_push_sends_each_server_its_words_whole_key_or_slice_by_slice() {
        use crate::compression::{CompressionType, GradientCompression, Residual};
        let gc = GradientCompression::new(CompressionType::TwoBit, 0.5).unwrap();
        let n = 1000;
        let grad: Vec<f32> = (0..n).map(|i| ((i * 37 % 23) as f32 - 11.0) / 10.0).collect();
        let mut whole = vec![0u32; gc.compressed_len(n)];
        Residual::zeros(n).quantize(&gc, &grad, &mut whole).unwrap();
        let ps = slicer::int_key(1);
        // K7.11 split (word boundaries) and K8.8 split (a boundary inside a word: 1000/3).
        let splits =
            [vec![Slice { server: 0, offset: 0, len: 336 }, Slice { server: 1, offset: 336, len: 664 }], slicer::slices(ps, n, 1, 3, 10)];
        for slices in splits {
            let info = Arc::new(KeyInfo::for_test(Key::Int(1), Shape::from(vec![n]), DType::F32, StorageType::Dense, slices.clone()));
            let item = Item {
                info: Arc::clone(&info),
                inputs: smallvec::smallvec![NDArray::from_vec([n], grad.clone()).unwrap()],
                outs: SmallVec::new(),
                ids: Vec::new(),
                part: None,
            };
            let (msgs, _) = build(Kind::Push, &[item], 0, Some(&gc), BUDGET, None).unwrap();
            assert_eq!(msgs.len(), slices.len());
            let mut values = vec![0.0f32; n];
            for ((server, m), s) in msgs.iter().zip(&slices) {
                assert_eq!(*server, s.server);
                assert!(m.flags.contains(Flags::COMPRESSED));
                assert_eq!(serde_json::from_str::<GradientCompression>(&m.meta.text).unwrap(), gc);
                let words = codec::words_of(&m.chunks[0]).unwrap();
                assert_eq!(words.len(), gc.compressed_len(s.len));
                gc.dequantize(&words, s.len, &mut values[s.offset..s.offset + s.len]).unwrap();
            }
            let mut expected = vec![0.0f32; n];
            gc.dequantize(&whole, n, &mut expected).unwrap();
            assert_eq!(values, expected, "slices {slices:?}");
            if slices[0].len % 16 == 0 {
                let sent: Vec<u32> = msgs.iter().flat_map(|(_, m)| codec::words_of(&m.chunks[0]).unwrap().into_owned()).collect();
                assert_eq!(sent, whole, "word-aligned slices carry exactly the whole key's words");
            }
            assert_eq!(info.packing.residual.get().unwrap().to_vec(), {
                let r = Residual::zeros(n);
                r.quantize(&gc, &grad, &mut whole.clone()).unwrap();
                r.to_vec()
            });
        }
    }

    #[test]
    fn with_a_lease_a_single_value_is_sent_from_its_own_memory_and_held_until_the_messages_drop() {
        let n = 1000;
        let ps = slicer::int_key(7);
        let slices = slicer::slices(ps, n, 1, 2, 10);
        let info = Arc::new(KeyInfo::for_test(Key::Int(7), Shape::from(vec![n]), DType::F32, StorageType::Dense, slices.clone()));
        let value = NDArray::from_vec([n], (0..n).map(|i| i as f32).collect::<Vec<f32>>()).unwrap();
        let lease: Lease = Arc::new(());
        for part in [None, Some(1)] {
            let memory = value.storage().dense().map(|b| codec::buffer_bytes(b).as_ptr() as usize).unwrap();
            let item =
                Item { info: Arc::clone(&info), inputs: smallvec::smallvec![value.clone()], outs: SmallVec::new(), ids: Vec::new(), part };
            let (msgs, _) = build(Kind::Push, &[item], 0, None, BUDGET, Some(&lease)).unwrap();
            let sent: Vec<(u32, usize, usize)> =
                msgs.iter().map(|(srv, m)| (*srv, m.chunks[0].data.as_ptr() as usize, m.chunks[0].data.len())).collect();
            let expected: Vec<(u32, usize, usize)> = slices
                .iter()
                .enumerate()
                .filter(|(p, _)| part.is_none_or(|q| q == *p))
                .map(|(_, s)| (s.server, memory + s.offset * 4, s.len * 4))
                .collect();
            assert_eq!(sent, expected, "each part's chunk is the array's own bytes (part {part:?})");
            assert!(Arc::strong_count(&lease) > 1, "the messages hold the lease");
            assert!(value.data_lock().try_write().is_none(), "and the array's data");
            drop(msgs);
            assert_eq!(Arc::strong_count(&lease), 1, "dropped with the messages");
            value.fill(2.0).unwrap();
        }
        // Another dtype is cast into a buffer: copied, not lent.
        let f16 = NDArray::from_vec([n], vec![half::f16::ONE; n]).unwrap();
        let item = Item { info, inputs: smallvec::smallvec![f16], outs: SmallVec::new(), ids: Vec::new(), part: None };
        let (msgs, _) = build(Kind::Push, &[item], 0, None, BUDGET, Some(&lease)).unwrap();
        assert_eq!(Arc::strong_count(&lease), 1);
        assert_eq!(codec::chunk_to_buffer(&msgs[0].1.chunks[0], DType::F32).unwrap().to_vec::<f32>(), vec![1.0f32; slices[0].len]);
    }
}

//! The dist store's data operations as asynchronous engine operations.
//!
//! An operation declares its vars (push: reads the values, writes the keys' vars; pull: reads
//! the keys' vars, writes the outputs; pushpull: both). A push releases the values it read as
//! soon as it has copied them (`Engine::push_async_consuming`), so waiting to overwrite a pushed
//! array never waits for the servers. On an engine thread it sums each
//! key's per-device values into one communication buffer (a copy: the caller's array is never
//! aliased, spec K12.1), cuts it into per-server slices (zero-copy `Bytes` slices), and packs
//! the keys of one server into one message. It hands the messages to the worker's tokio
//! runtime and returns; the engine operation completes when every server has replied —
//! pulled values are written into the outputs first — or fails with the dist error (a lost
//! node, a timeout, a server's refusal), which the next wait on an output reports.

use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use super::keys::KeyInfo;
use crate::compression::GradientCompression;
use crate::engine::{Completion, Engine, Priority, Var};
use crate::ndarray::{sparse, Buffer, RowSparse, Storage};
use crate::ps::codec::{self, chunk_len};
use crate::ps::proto::{Chunk, Command, Flags, Message};
use crate::ps::slicer::Slice;
use crate::ps::{Client, Error as DistError};
use crate::{NDArray, StorageType};

/// Small keys of one call are packed into one operation up to this many elements.
pub(crate) const BATCH_ELEMS: usize = 4 << 20;

/// What an operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Push,
    Pull,
    PushPull,
    RowSparsePull,
}

/// One key's part of an operation.
pub(crate) struct Item {
    pub(crate) info: Arc<KeyInfo>,
    /// Values pushed (push, pushpull).
    pub(crate) inputs: SmallVec<[NDArray; 4]>,
    /// Outputs written (pull, pushpull, row_sparse_pull).
    pub(crate) outs: SmallVec<[NDArray; 4]>,
    /// Requested rows, sorted and unique (row_sparse_pull).
    pub(crate) ids: Vec<i64>,
}

/// What an operation needs from the store.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) client: Client,
    pub(crate) rt: tokio::runtime::Handle,
}

/// Where each key of a message goes back to: (item, slice, first requested row).
type Places = Vec<(usize, Slice, usize)>;

/// An operation's messages (with their servers) and, per message, where its keys go back to.
type Built = (Vec<(u32, Message)>, Vec<Places>);

/// Splits items into operations: a big (split) key alone, small keys together.
pub(crate) fn batches(items: Vec<Item>) -> Vec<Vec<Item>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut elems = 0usize;
    for it in items {
        if it.info.is_big() {
            out.push(vec![it]);
            continue;
        }
        elems += it.info.shape.size();
        cur.push(it);
        if elems >= BATCH_ELEMS {
            out.push(std::mem::take(&mut cur));
            elems = 0;
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Schedules one operation over `items`; with `compression`, dense pushes travel as packed
/// words (every item of a compressed push is a dense f32 key: the store checked).
pub(crate) fn schedule(ctx: &Ctx, kind: Kind, items: Vec<Item>, priority: Priority, compression: Option<GradientCompression>) {
    let mut reads: Vec<Var> = Vec::new();
    let mut writes: Vec<Var> = Vec::new();
    for it in &items {
        reads.extend(it.inputs.iter().map(|a| a.var().clone()));
        match kind {
            Kind::Push => writes.push(it.info.var.clone()),
            Kind::PushPull => {
                writes.push(it.info.var.clone());
                writes.extend(it.outs.iter().map(|a| a.var().clone()));
            }
            Kind::Pull | Kind::RowSparsePull => {
                reads.push(it.info.var.clone());
                writes.extend(it.outs.iter().map(|a| a.var().clone()));
            }
        }
    }
    let name = match kind {
        Kind::Push => "dist push",
        Kind::Pull => "dist pull",
        Kind::PushPull => "dist pushpull",
        Kind::RowSparsePull => "dist row_sparse_pull",
    };
    let ctx = ctx.clone();
    let body = move |done: Completion| {
        if kind == Kind::RowSparsePull {
            items.iter().for_each(prepare_row_outputs);
        }
        let (msgs, places) = match build(kind, &items, priority, compression.as_ref()) {
            Ok(built) => built,
            Err(e) => return done.fail(Box::new(e)),
        };
        let Ctx { client, rt } = ctx;
        rt.spawn(async move {
            let result = match client.request_all(msgs).await {
                Ok(replies) => write_back(kind, &items, &places, &replies),
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => done.done(),
                Err(e) => done.fail(Box::new(e)),
            }
        });
    };
    match kind {
        // The body copies (or quantizes) the pushed arrays before it returns: they are free
        // again then, long before the servers answer.
        Kind::Push | Kind::PushPull => Engine::global().push_async_consuming(name, &reads, &writes, priority, body),
        Kind::Pull | Kind::RowSparsePull => Engine::global().push_async(name, &reads, &writes, priority, body),
    }
}

/// Messages under construction, one per (server, dense|rows).
struct Builder {
    command: Command,
    priority: Priority,
    /// Set for a compressed push.
    compression: Option<GradientCompression>,
    msgs: Vec<(u32, bool, Message, Places)>,
}

impl Builder {
    fn slot(&mut self, server: u32, rows: bool) -> &mut (u32, bool, Message, Places) {
        let pos = self.msgs.iter().position(|(s, r, _, _)| *s == server && *r == rows);
        let i = pos.unwrap_or_else(|| {
            let mut m = Message::new(self.command);
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
            self.msgs.push((server, rows, m, Vec::new()));
            self.msgs.len() - 1
        });
        &mut self.msgs[i]
    }

    fn add(&mut self, server: u32, rows: bool, ps: u64, len: u64, chunks: impl IntoIterator<Item = Chunk>, place: (usize, Slice, usize)) {
        let (_, _, m, places) = self.slot(server, rows);
        m.meta.keys.push(ps);
        m.meta.lens.push(len);
        m.chunks.extend(chunks);
        places.push(place);
    }
}

fn byte_len(chunks: &[Chunk]) -> u64 {
    chunks.iter().map(|c| u64::try_from(c.data.len()).unwrap_or(u64::MAX)).sum()
}

/// The communication bytes of a dense key's push: one copy of a single value (into the key's
/// reused buffer), or the sum of several handed over without another copy.
fn dense_bytes(item: &Item) -> Option<Bytes> {
    let info = &item.info;
    if let [one] = item.inputs.as_slice() {
        let guard = one.storage();
        if let Some(b) = guard.dense().filter(|b| b.dtype() == info.dtype) {
            let mut spare = info.spare.lock();
            let bytes = codec::copy_reusing(codec::buffer_bytes(b), spare.take());
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
fn merged(item: &Item) -> Storage {
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
/// with the key's residual, slice by slice, into one buffer of packed words; returns each
/// slice's words as zero-copy `Bytes`.
///
/// A key split in units of words (K7.11) gives exactly the words of quantizing it whole; a
/// key split before compression was turned on (K8.8 boundaries inside a word) gets each
/// slice's words separately, with the same values.
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
fn build(kind: Kind, items: &[Item], priority: Priority, compression: Option<&GradientCompression>) -> crate::Result<Built> {
    let command = match kind {
        Kind::Push => Command::Push,
        Kind::PushPull => Command::PushPull,
        Kind::Pull | Kind::RowSparsePull => Command::Pull,
    };
    let compression = compression.filter(|_| matches!(kind, Kind::Push | Kind::PushPull)).copied();
    let mut b = Builder { command, priority, compression, msgs: Vec::new() };
    for (i, item) in items.iter().enumerate() {
        let info = &item.info;
        let es = info.dtype.size_of();
        let unit = info.unit();
        match kind {
            Kind::Push | Kind::PushPull if info.stype == StorageType::Dense && compression.is_some() => {
                let Some(gc) = &compression else { continue };
                for (s, data) in info.slices.iter().zip(packed_bytes(item, gc)?) {
                    let chunk = Chunk { dtype: crate::ps::proto::DTypeCode::U32, data };
                    b.add(s.server, false, info.ps, byte_len(std::slice::from_ref(&chunk)), [chunk], (i, *s, 0));
                }
            }
            Kind::Push | Kind::PushPull if info.stype == StorageType::Dense => {
                let bytes = dense_bytes(item).unwrap_or_default();
                for s in &info.slices {
                    let range = s.offset * unit * es..(s.offset + s.len) * unit * es;
                    // The bytes hold the whole key (its shape was checked); never slice past them.
                    let data = if range.end <= bytes.len() { bytes.slice(range) } else { Bytes::new() };
                    let chunk = Chunk { dtype: codec::dtype_code(info.dtype), data };
                    b.add(s.server, false, info.ps, byte_len(std::slice::from_ref(&chunk)), [chunk], (i, *s, 0));
                }
            }
            Kind::Push | Kind::PushPull => {
                if let Storage::RowSparse(rs) = merged(item) {
                    add_rows(&mut b, i, info, &rs);
                }
            }
            Kind::Pull => {
                for s in &info.slices {
                    let len = u64::try_from(s.len * unit * es).unwrap_or(u64::MAX);
                    b.add(s.server, false, info.ps, len, [], (i, *s, 0));
                }
            }
            Kind::RowSparsePull => {
                let mut start = 0usize;
                for s in &info.slices {
                    let (lo, hi) = (to_i64(s.offset), to_i64(s.offset + s.len));
                    let n = item.ids[start..].iter().take_while(|&&id| id < hi).count();
                    let rel: Vec<i64> = item.ids[start..start + n].iter().map(|id| id - lo).collect();
                    if !rel.is_empty() {
                        let chunk = codec::ids_to_chunk(&rel);
                        b.add(s.server, true, info.ps, byte_len(std::slice::from_ref(&chunk)), [chunk], (i, *s, start));
                    }
                    start += n;
                }
            }
        }
    }
    let mut msgs = Vec::with_capacity(b.msgs.len());
    let mut places = Vec::with_capacity(b.msgs.len());
    for (server, _, m, p) in b.msgs {
        msgs.push((server, m));
        places.push(p);
    }
    Ok((msgs, places))
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Adds a row_sparse value's rows to the messages of the servers holding them (ids relative
/// to each slice). Every slice gets its key, even with no rows, so every server counts this
/// worker's push in its round.
fn add_rows(b: &mut Builder, i: usize, info: &KeyInfo, rs: &RowSparse) {
    let row_len = info.shape.row_len();
    let mut start = 0usize;
    for s in &info.slices {
        let (lo, hi) = (to_i64(s.offset), to_i64(s.offset + s.len));
        let n = rs.indices[start..].iter().take_while(|&&id| id < hi).count();
        let rel: Vec<i64> = rs.indices[start..start + n].iter().map(|id| id - lo).collect();
        let ids = codec::ids_to_chunk(&rel);
        let data = codec::range_to_chunk(&rs.data, start * row_len, n * row_len);
        let chunks = [ids, data];
        b.add(s.server, true, info.ps, byte_len(&chunks), chunks, (i, *s, start));
        start += n;
    }
}

/// Writes pulled values into the outputs.
fn write_back(kind: Kind, items: &[Item], places: &[Places], replies: &[Message]) -> Result<(), DistError> {
    if kind == Kind::Push {
        return Ok(());
    }
    for (place, reply) in places.iter().zip(replies) {
        let per_key = if kind == Kind::RowSparsePull { 2 } else { 1 };
        if reply.meta.keys.len() != place.len() || reply.chunks.len() != place.len() * per_key {
            let detail = format!("{} keys and {} chunks for a request of {} keys", reply.meta.keys.len(), reply.chunks.len(), place.len());
            return Err(DistError::Unexpected { peer: format!("node {}", reply.sender), command: Command::Reply, detail });
        }
        for (j, &(i, slice, start)) in place.iter().enumerate() {
            let item = &items[i];
            if reply.meta.keys[j] != item.info.ps {
                let detail = format!("key {} answered in place of key {}", reply.meta.keys[j], item.info.key);
                return Err(DistError::Unexpected { peer: format!("node {}", reply.sender), command: Command::Reply, detail });
            }
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
                for out in &item.outs {
                    let mut st = out.storage_mut();
                    if let Some(d) = st.dense_mut() {
                        codec::copy_chunk_into(d, slice.offset * unit, slice.len * unit, &reply.chunks[j]).map_err(fail)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Prepares the outputs of a row_sparse pull (inside the operation, which holds their vars):
/// exactly the requested rows, zero until filled.
fn prepare_row_outputs(item: &Item) {
    for out in &item.outs {
        let rows = RowSparse { indices: item.ids.clone(), data: Buffer::zeros(out.dtype(), item.ids.len() * item.info.shape.row_len()) };
        *out.storage_mut() = Storage::RowSparse(rows);
    }
}

/// The bytes of a command body.
pub(crate) fn body(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::codec::chunk_len;
    use crate::ps::slicer;
    use crate::store::Key;
    use crate::{Context, DType, Shape};

    fn rows_key(rows: usize, row_len: usize) -> Arc<KeyInfo> {
        let ps = slicer::str_key("emb");
        Arc::new(KeyInfo {
            key: Key::from("emb"),
            ps,
            shape: Shape::from(vec![rows, row_len]),
            dtype: DType::F32,
            stype: StorageType::RowSparse,
            var: Var::new(),
            slices: slicer::slices(ps, rows, row_len, 2, 100),
            spare: Default::default(),
            packing: Default::default(),
        })
    }

    #[test]
    fn only_touched_rows_travel_with_ids_relative_to_each_slice() {
        let info = rows_key(1000, 4);
        assert_eq!(info.slices.len(), 2);
        let value = NDArray::row_sparse([1000, 4], vec![3, 600], Buffer::from_vec(vec![1.0f32; 8]), Context::cpu(0)).unwrap();
        let item = Item { info: Arc::clone(&info), inputs: smallvec::smallvec![value], outs: SmallVec::new(), ids: Vec::new() };
        let (msgs, places) = build(Kind::Push, &[item], 0, None).unwrap();
        assert_eq!(msgs.len(), 2);
        for ((server, m), place) in msgs.iter().zip(&places) {
            assert!(m.flags.contains(Flags::ROW_SPARSE));
            let ids = codec::ids_from_chunk(&m.chunks[0], 500).unwrap();
            assert_eq!(ids, if *server == 0 { vec![3] } else { vec![100] });
            assert_eq!(chunk_len(&m.chunks[1]), 4, "one row of 4 elements, not the whole key");
            assert_eq!(place.len(), 1);
        }
        let pull = Item { info, inputs: SmallVec::new(), outs: SmallVec::new(), ids: vec![1, 2, 999] };
        let (msgs, places) = build(Kind::RowSparsePull, &[pull], 0, None).unwrap();
        let asked: Vec<(u32, Vec<i64>)> = msgs.iter().map(|(s, m)| (*s, codec::ids_from_chunk(&m.chunks[0], 500).unwrap())).collect();
        assert_eq!(asked, vec![(0, vec![1, 2]), (1, vec![499])]);
        assert_eq!(places[1][0].2, 2, "server 1's rows start at position 2 of the output");
    }

    #[test]
    fn small_keys_of_a_call_share_one_message_per_server() {
        let keys: Vec<Arc<KeyInfo>> = (0..100)
            .map(|k| {
                let ps = slicer::int_key(k);
                Arc::new(KeyInfo {
                    key: Key::Int(k),
                    ps,
                    shape: Shape::from(vec![10]),
                    dtype: DType::F32,
                    stype: StorageType::Dense,
                    var: Var::new(),
                    slices: slicer::slices(ps, 10, 1, 2, 1000),
                    spare: Default::default(),
                    packing: Default::default(),
                })
            })
            .collect();
        let items: Vec<Item> = keys
            .iter()
            .map(|info| Item {
                info: Arc::clone(info),
                inputs: smallvec::smallvec![NDArray::ones([10])],
                outs: SmallVec::new(),
                ids: Vec::new(),
            })
            .collect();
        let batches = batches(items);
        assert_eq!(batches.len(), 1);
        let (msgs, _) = build(Kind::Push, &batches[0], 0, None).unwrap();
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
            let info = Arc::new(KeyInfo {
                key: Key::Int(1),
                ps,
                shape: Shape::from(vec![n]),
                dtype: DType::F32,
                stype: StorageType::Dense,
                var: Var::new(),
                slices: slices.clone(),
                spare: Default::default(),
                packing: Default::default(),
            });
            let item = Item {
                info: Arc::clone(&info),
                inputs: smallvec::smallvec![NDArray::from_vec([n], grad.clone()).unwrap()],
                outs: SmallVec::new(),
                ids: Vec::new(),
            };
            let (msgs, _) = build(Kind::Push, &[item], 0, Some(&gc)).unwrap();
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
}

//! `init` on a distributed store: every worker registers the keys (so each can validate its
//! own calls), rank 0 alone sends their values, then every worker waits at a barrier, so any
//! worker can pull at once (spec K2.4).
//!
//! The values travel as `Push` + `INIT` messages, one entry per key part (a row_sparse key
//! with every row, absent rows as zeros, spec K2.6), with the keys' names as a JSON list in
//! the text field. Messages are cut like every other (`build.rs`): by keys, chunks and the
//! byte budget, and by the frame's text limit for the names, so any number of keys and any
//! value size can be initialised.

use std::sync::Arc;

use smallvec::SmallVec;

use super::keys::KeyInfo;
use super::reply::refusal;
use super::{block, DistStore};
use crate::ndarray::Storage;
use crate::ps::codec;
use crate::ps::proto::{Chunk, Command, Flags, Message};
use crate::store::{Error, Key};
use crate::{NDArray, StorageType};

/// How many times a restarted worker asks the servers to rejoin its keys' parts at one round
/// before it gives up (each try fixes every part that answered; a part moves on only while
/// the server has not heard that the worker is back).
const REJOIN_TRIES: usize = 8;

/// For each key part, the latest round among the parts of its key (`parts` lists a key's
/// parts one after another).
fn latest_per_key(parts: &[(Arc<KeyInfo>, usize)], rounds: &[u64]) -> Vec<u64> {
    let mut out = rounds.to_vec();
    let mut start = 0;
    while start < parts.len() {
        let ps = parts[start].0.ps;
        let end = parts[start..].iter().position(|(i, _)| i.ps != ps).map_or(parts.len(), |n| start + n);
        let latest = rounds[start..end].iter().copied().max().unwrap_or(0);
        out[start..end].fill(latest);
        start = end;
    }
    out
}

/// An init message under construction.
struct Open {
    server: u32,
    rows: bool,
    msg: Message,
    names: Vec<String>,
    bytes: usize,
    /// Bytes of the names' JSON list.
    text: usize,
}

impl DistStore {
    /// Registers keys on this worker; rank 0 sends their values; then a worker barrier.
    pub(crate) fn init(&self, pairs: Vec<(Key, &NDArray)>) -> crate::Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        for (key, value) in &pairs {
            if value.storage_type() == StorageType::RowSparse && value.shape().ndim() == 0 {
                return Err(Error::UnsupportedStorage {
                    op: "init",
                    key: key.clone(),
                    stype: StorageType::RowSparse,
                    hint: "a row_sparse key needs at least one dimension",
                }
                .into());
            }
        }
        let packing = self.compression.lock().map(|gc| gc.kind());
        let infos = self.registry.lock().register(&pairs, self.layout, &self.name, packing)?;
        if self.rejoined {
            return self.adopt(&infos);
        }
        let sent = if self.rank == 0 { self.send_init(&infos, &pairs) } else { Ok(()) };
        // Every worker waits here, even when rank 0 failed, so nobody is left at the barrier.
        let barrier = self.barrier();
        sent?;
        barrier
    }

    /// A restarted worker's `init`: the servers hold the keys already (the job is running), so
    /// nothing is sent and no barrier waits for the others; each key part's round-id count
    /// continues from its predecessor's (a `Pull` with flag `ROUND_IDS`), so its pushes join
    /// the rounds in progress and none is refused as a duplicate.
    ///
    /// Sync: the servers heard of the predecessor's death at their own times, so one part of a
    /// key may have completed a round without it that another still holds open for it. The
    /// worker therefore *rejoins* every part of a key at the latest of the parts' rounds (the
    /// same request with those rounds): the rounds below complete without it everywhere and
    /// every part waits for it from there, so a key's parts stay in step. A part that moved on
    /// meanwhile answers a later round, and the key is asked again at that one.
    fn adopt(&self, infos: &[Arc<KeyInfo>]) -> crate::Result<()> {
        let parts: Vec<(Arc<KeyInfo>, usize)> =
            infos.iter().flat_map(|info| (0..info.slices.len()).map(move |part| (Arc::clone(info), part))).collect();
        let mut rounds = self.round_ids(&parts, None)?;
        if self.sync {
            let first = latest_per_key(&parts, &rounds);
            let behind = first.iter().zip(&rounds).filter(|(t, r)| t != r).count();
            if behind > 0 {
                tracing::warn!(
                    "rejoin: {behind} key parts are a round behind other parts of their keys (the servers heard of the death at different times); they skip to their keys' round"
                );
            }
            let mut aligned = false;
            for _ in 0..REJOIN_TRIES {
                let targets = latest_per_key(&parts, &rounds);
                rounds = self.round_ids(&parts, Some(&targets))?;
                if rounds == targets {
                    aligned = true;
                    break;
                }
            }
            if !aligned {
                return Err(crate::ps::Error::InvalidArgument(format!(
                    "could not rejoin the rounds of every key part at one round in {REJOIN_TRIES} tries: the other workers' rounds keep completing without this one; are all nodes the same synkv version?"
                ))
                .into());
            }
        }
        for ((info, part), round) in parts.iter().zip(rounds) {
            info.rounds[*part].store(round, std::sync::atomic::Ordering::Release);
        }
        tracing::warn!("rejoined: {} keys adopted from the servers; pushes continue the rounds in progress", infos.len());
        Ok(())
    }

    /// The round id this worker's next push of each part must carry (`ROUND_IDS`); with
    /// `rejoin`, after rejoining each part at the round given for it.
    fn round_ids(&self, parts: &[(Arc<KeyInfo>, usize)], rejoin: Option<&[u64]>) -> crate::Result<Vec<u64>> {
        let mut msgs: Vec<(u32, Message)> = Vec::new();
        let mut asked: Vec<Vec<usize>> = Vec::new();
        for (p, (info, part)) in parts.iter().enumerate() {
            let s = info.slices[*part];
            let i = match msgs.iter().rposition(|(server, m)| *server == s.server && m.meta.keys.len() < self.ctx.budget.keys) {
                Some(i) => i,
                None => {
                    msgs.push((s.server, Message::new(Command::Pull).with_flags(Flags::ROUND_IDS)));
                    asked.push(Vec::new());
                    msgs.len() - 1
                }
            };
            let meta = &mut msgs[i].1.meta;
            meta.push_key(info.ps, 0, u64::try_from(s.offset).unwrap_or(u64::MAX));
            if let Some(rounds) = rejoin {
                meta.rounds.push(rounds[p]);
            }
            asked[i].push(p);
        }
        let replies = block(&self.handle, self.ctx.client.request_all(msgs))
            .map_err(|e| refusal(e, "init", parts.iter().map(|(i, _)| (i.ps, i.key.clone()))))?;
        let mut rounds = vec![0; parts.len()];
        for (reply, asked) in replies.iter().zip(&asked) {
            if reply.meta.rounds.len() != asked.len() {
                return Err(crate::ps::Error::InvalidArgument(format!(
                    "a server answered {} round ids for {} key parts; are all nodes the same synkv version?",
                    reply.meta.rounds.len(),
                    asked.len()
                ))
                .into());
            }
            for (round, &p) in reply.meta.rounds.iter().zip(asked) {
                rounds[p] = *round;
            }
        }
        Ok(rounds)
    }

    fn send_init(&self, infos: &[Arc<KeyInfo>], pairs: &[(Key, &NDArray)]) -> crate::Result<()> {
        let budget = self.ctx.budget;
        let mut msgs: Vec<Open> = Vec::new();
        for (info, (_, value)) in infos.iter().zip(pairs) {
            let snapshot = value.storage_snapshot()?;
            let shape = &info.shape;
            let rows_key = info.stype == StorageType::RowSparse;
            let buf = match snapshot {
                Storage::Dense(b) => b,
                other => other.to_dense_buffer(shape.rows(), shape.row_len()),
            };
            let unit = info.unit();
            let name = info.key.to_string();
            // The name's share of the JSON list: quotes, comma, and escapes at worst.
            let name_bytes = serde_json::to_string(&name).map_or(name.len() * 6 + 2, |j| j.len()) + 1;
            for s in &info.slices {
                let mut chunks: SmallVec<[Chunk; 2]> = SmallVec::new();
                if rows_key {
                    let ids: Vec<i64> = (0..s.len).map(|i| i64::try_from(i).unwrap_or(i64::MAX)).collect();
                    chunks.push(codec::ids_to_chunk(&ids));
                }
                chunks.push(codec::range_to_chunk(&buf, s.offset * unit, s.len * unit));
                let bytes: usize = chunks.iter().map(|c| c.data.len()).sum::<usize>() + 64;
                let fits = |o: &Open| {
                    o.server == s.server
                        && o.rows == rows_key
                        && o.msg.meta.keys.len() < budget.keys
                        && o.msg.chunks.len() + chunks.len() <= budget.chunks
                        && o.bytes + bytes <= budget.bytes
                        && o.text + name_bytes + 2 <= self.max_text
                };
                let i = match msgs.iter().rposition(|o| o.server == s.server && o.rows == rows_key) {
                    Some(i) if fits(&msgs[i]) => i,
                    _ => {
                        let flags = if rows_key { Flags::INIT.with(Flags::ROW_SPARSE) } else { Flags::INIT };
                        let msg = Message::new(Command::Push).with_flags(flags);
                        msgs.push(Open { server: s.server, rows: rows_key, msg, names: Vec::new(), bytes: 0, text: 0 });
                        msgs.len() - 1
                    }
                };
                let open = &mut msgs[i];
                let m = &mut open.msg;
                m.meta.push_key(info.ps, u64::try_from(bytes - 64).unwrap_or(u64::MAX), u64::try_from(s.offset).unwrap_or(u64::MAX));
                m.chunks.extend(chunks);
                open.names.push(name.clone());
                open.bytes += bytes;
                open.text += name_bytes;
            }
        }
        let requests: Vec<(u32, Message)> = msgs
            .into_iter()
            .map(|mut o| {
                o.msg.meta.text = serde_json::to_string(&o.names).unwrap_or_default();
                (o.server, o.msg)
            })
            .collect();
        block(&self.handle, self.ctx.client.request_all(requests))
            .map_err(|e| refusal(e, "init", infos.iter().map(|i| (i.ps, i.key.clone()))))?;
        Ok(())
    }
}

//! Replication of a partition to its backup copy on another server
//! (`SYNKV_SERVER_REPLICAS=1`), after aggregation as in the Parameter Server paper: the primary
//! sends each completed sync round's *sum* (or the new value, for an assign) — not every
//! worker's push — and the backup applies it with the same code, so both hold the same bits.
//!
//! **Primary side** ([`Replication`]): every change is a `Replicate` message to the backup's
//! link, numbered (request id = sequence number): an `init`, the rounds completed while
//! handling one event (batched), an async push as it came (the backup applies it exactly as
//! the primary did, its round ids deduplicating alike), an optimizer or mode command, and the
//! whole partition as a *snapshot* when a backup is (re)assigned. Every reply the primary
//! produces after a change waits until the backup has acknowledged it: no worker ever sees a
//! value its backup could not reproduce, so a failover loses nothing a worker has seen.
//!
//! **Replica side** ([`Partition::replicated`]): applies the messages in order; a snapshot
//! replaces the copy and, when complete, is reported (`ReplicaReady`) so the scheduler counts
//! the partition as protected again.
//!
//! | `meta.priority` (kind) | content | applied as |
//! |---|---|---|
//! | 1 `INIT` | the worker's init message | `init` |
//! | 2 `ROUNDS` | per key part: offset, new round id; text = JSON list of `"a"` (value), `"u"` (sum for the updater), `"ra"`/`"ru"` (rows: ids + sum) | the round's one part |
//! | 3 `ASYNC` | the worker's async push; head = worker rank | `push` |
//! | 4 `COMMAND` | `SetOptimizer`, `SyncMode` or `SetOptimizerStates` | `command` |
//! | 5 `BEGIN` | text = JSON `{"sync", "optimizer"}` | empties the copy |
//! | 6 `ENTRIES` | text = JSON list of entries (checkpoint description, async ids); chunks = values | adds them |
//! | 7 `STATES` | chunk 0 = a page of optimizer states | merges them |
//! | 8 `END` | — | the copy is complete |
//! | 9 `HOLDS` | per key part: the round a rejoined worker joined at (`meta.rounds`); head = worker rank; text = JSON list of the holds' move counts | the entries' holds (`round.rs`) |
//!
//! A snapshot's entries carry their holds too. The reply to a rejoin waits for its `HOLDS`
//! like any other: a backup promoted while a part still lags behind the round a restarted
//! worker joined at skips that worker in the rounds below it and expects its pushes from it on,
//! as the primary did (without, it would wait for a push that never comes and refuse the ones
//! that do with `RoundGap`).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{entry_key, Partition, Role};
use crate::ndarray::RowSparse;
use crate::optimizer::Updater;
use crate::ps::checkpoint::EntryDesc;
use crate::ps::codec;
use crate::ps::node::Rank;
use crate::ps::proto::{Chunk, Command, ErrorCode, Flags, Message};
use crate::ps::server::entry::{Entry, EntryKey, Part, Upd};
use crate::ps::server::error::ServerError;
use crate::ps::server::round::Hold;
use crate::ps::transport::Outbox;

/// Kinds of `Replicate` messages (`meta.priority`).
pub(in crate::ps::server) mod kind {
    pub(in crate::ps::server) const INIT: i32 = 1;
    pub(in crate::ps::server) const ROUNDS: i32 = 2;
    pub(in crate::ps::server) const ASYNC: i32 = 3;
    pub(in crate::ps::server) const COMMAND: i32 = 4;
    pub(in crate::ps::server) const BEGIN: i32 = 5;
    pub(in crate::ps::server) const ENTRIES: i32 = 6;
    pub(in crate::ps::server) const STATES: i32 = 7;
    pub(in crate::ps::server) const END: i32 = 8;
    pub(in crate::ps::server) const HOLDS: i32 = 9;
}

/// What a completed round changed, as its backup copy needs it.
pub(in crate::ps::server) enum RoundChange {
    /// The new value (the round assigned the sum).
    Assign(Chunk),
    /// The sum, in the compute dtype, that the updater was applied to.
    Update(Chunk),
    /// The summed rows (compute dtype) of a row_sparse round, and whether the updater ran.
    Rows(RowSparse, bool),
}

/// A batch of completed rounds being built.
struct Batch {
    seq: u64,
    msg: Message,
    kinds: Vec<&'static str>,
    bytes: usize,
}

/// The primary side of a partition's replication.
#[derive(Default)]
pub(in crate::ps::server) struct Replication {
    /// The backup's link (`None`: no backup).
    backup: Option<Outbox>,
    /// The partition's number and this server's node id, stamped on every message.
    partition: u16,
    sender: Option<crate::ps::node::NodeId>,
    /// The last sequence number given to a message (sent or batching).
    last: u64,
    /// The highest sequence number the backup acknowledged.
    acked: u64,
    batch: Option<Batch>,
    /// Replies waiting for an acknowledgement: (sequence number, connection, reply).
    pub(super) gated: VecDeque<(u64, u64, Message)>,
}

impl Replication {
    /// Whether changes are replicated.
    pub(in crate::ps::server) fn active(&self) -> bool {
        self.backup.is_some()
    }

    /// The sequence number a reply produced now must wait for, if any.
    pub(super) fn gate(&self) -> Option<u64> {
        let last = self.batch.as_ref().map_or(self.last, |b| b.seq);
        (self.backup.is_some() && last > self.acked).then_some(last)
    }

    /// Adds a completed round of entry `key` (its new round id `round`) to the batch.
    pub(super) fn add_round(&mut self, key: EntryKey, round: u64, change: RoundChange, max_bytes: usize) {
        if self.backup.is_none() {
            return;
        }
        let (kind, chunks): (&'static str, Vec<Chunk>) = match change {
            RoundChange::Assign(c) => ("a", vec![c]),
            RoundChange::Update(c) => ("u", vec![c]),
            RoundChange::Rows(sum, update) => {
                let data = codec::range_to_chunk(&sum.data, 0, sum.data.len());
                (if update { "ru" } else { "ra" }, vec![codec::ids_to_chunk(&sum.indices), data])
            }
        };
        let bytes: usize = chunks.iter().map(|c| c.data.len()).sum();
        if self.batch.as_ref().is_some_and(|b| b.bytes > 0 && b.bytes + bytes > max_bytes) {
            self.flush();
        }
        if self.batch.is_none() {
            self.last += 1;
            let mut msg = Message::new(Command::Replicate);
            msg.meta.priority = kind::ROUNDS;
            self.batch = Some(Batch { seq: self.last, msg, kinds: Vec::new(), bytes: 0 });
        }
        let Some(b) = self.batch.as_mut() else { return };
        b.msg.meta.push_key(key.0, u64::try_from(bytes).unwrap_or(u64::MAX), key.1);
        b.msg.meta.rounds.push(round);
        b.msg.chunks.extend(chunks);
        b.kinds.push(kind);
        b.bytes += bytes;
    }

    /// Sends the batch of rounds, if any.
    pub(super) fn flush(&mut self) {
        let Some(mut b) = self.batch.take() else { return };
        b.msg.meta.text = serde_json::to_string(&b.kinds).unwrap_or_default();
        self.transmit(b.seq, b.msg);
    }

    /// Sends a change of kind `kind` now (after the batch, so they stay in order).
    pub(super) fn send(&mut self, kind: i32, mut msg: Message) {
        if self.backup.is_none() {
            return;
        }
        self.flush();
        self.last += 1;
        msg.command = Command::Replicate;
        msg.meta.priority = kind;
        self.transmit(self.last, msg);
    }

    fn transmit(&mut self, seq: u64, mut msg: Message) {
        let Some(outbox) = &self.backup else { return };
        msg.request_id = seq;
        msg.partition = Some(self.partition);
        msg.flags = msg.flags.with(Flags::REQUEST);
        if let Some(me) = self.sender {
            msg = msg.with_sender(me);
        }
        if let Err(e) = outbox.try_send(msg) {
            // The backup is gone; the scheduler's failover assigns a new one.
            tracing::warn!("replication of partition {} stopped: {e}", self.partition);
        }
    }

    /// The backup acknowledged everything up to `seq`: the replies waiting for it.
    pub(super) fn ack(&mut self, seq: u64) -> Vec<(u64, Message)> {
        self.acked = self.acked.max(seq);
        let mut out = Vec::new();
        while self.gated.front().is_some_and(|(s, _, _)| *s <= self.acked) {
            if let Some((_, conn, msg)) = self.gated.pop_front() {
                out.push((conn, msg));
            }
        }
        out
    }

    /// A new backup link (or none): the replies waiting for the old one go now — a
    /// snapshot brings the new backup up to date.
    pub(super) fn set_backup(&mut self, partition: u16, me: crate::ps::node::NodeId, backup: Option<Outbox>) -> Vec<(u64, Message)> {
        self.flush();
        self.partition = partition;
        self.sender = Some(me);
        self.backup = backup;
        self.acked = self.last;
        self.gated.drain(..).map(|(_, conn, msg)| (conn, msg)).collect()
    }
}

/// An entry in a snapshot.
#[derive(Serialize, Deserialize)]
struct SnapEntry {
    desc: EntryDesc,
    async_next: Vec<u64>,
    restored: bool,
    /// Rejoined workers' holds on the entry's rounds.
    holds: Vec<Hold>,
}

#[derive(Serialize, Deserialize)]
struct SnapBegin {
    sync: bool,
    optimizer: Option<String>,
}

fn bad(what: String) -> ServerError {
    ServerError::new(ErrorCode::Other, format!("replication: {what}"))
}

impl Partition {
    /// Sends the whole partition to its (new) backup: `BEGIN`, its entries in batches of at
    /// most `page_bytes`, its optimizer states in pages, `END`.
    pub(in crate::ps::server) fn send_snapshot(&mut self) {
        let begin = SnapBegin { sync: self.sync, optimizer: self.updater.as_ref().map(|u| u.optimizer().to_json()) };
        let mut m = Message::new(Command::Replicate);
        m.meta.text = serde_json::to_string(&begin).unwrap_or_default();
        self.repl.send(kind::BEGIN, m);
        let mut keys: Vec<EntryKey> = self.keys.keys().copied().collect();
        keys.sort_unstable();
        let page = self.settings.page_bytes.max(1);
        let (mut batch, mut chunks, mut bytes) = (Vec::new(), Vec::new(), 0usize);
        for k in keys {
            let Some(e) = self.keys.get(&k) else { continue };
            let value = e.value_chunk();
            if !batch.is_empty() && bytes + value.data.len() > page {
                let mut m = Message::new(Command::Replicate);
                m.meta.text = serde_json::to_string(&std::mem::take(&mut batch)).unwrap_or_default();
                m.chunks = std::mem::take(&mut chunks);
                self.repl.send(kind::ENTRIES, m);
                bytes = 0;
            }
            bytes += value.data.len();
            batch.push(SnapEntry { desc: e.desc(k), async_next: e.async_next.clone(), restored: e.restored, holds: e.round.holds.clone() });
            chunks.push(value);
        }
        if !batch.is_empty() {
            let mut m = Message::new(Command::Replicate);
            m.meta.text = serde_json::to_string(&batch).unwrap_or_default();
            m.chunks = chunks;
            self.repl.send(kind::ENTRIES, m);
        }
        if let Some(u) = &self.updater {
            let mut names: Vec<String> = u.state_keys().map(str::to_owned).collect();
            names.sort();
            let mut pages = Vec::new();
            let (mut keys, mut bytes): (Vec<&str>, usize) = (Vec::new(), 0);
            for k in &names {
                let b = u.state_bytes(k).saturating_add(k.len() + 256);
                if !keys.is_empty() && bytes.saturating_add(b) > page {
                    pages.push(u.save_states_of(&keys));
                    keys.clear();
                    bytes = 0;
                }
                bytes = bytes.saturating_add(b);
                keys.push(k);
            }
            // One page even without states: it carries the updater's update count.
            pages.push(u.save_states_of(&keys));
            for p in pages {
                let mut m = Message::new(Command::Replicate);
                m.chunks.push(Chunk::bytes(p));
                self.repl.send(kind::STATES, m);
            }
        }
        self.repl.send(kind::END, Message::new(Command::Replicate));
    }

    /// Applies one `Replicate` message to this backup copy. Returns whether it completed a
    /// snapshot (the copy is whole again).
    pub(in crate::ps::server) fn replicated(&mut self, msg: &Message) -> Result<bool, ServerError> {
        if self.role != Role::Replica {
            return Err(bad(format!("partition {} is served here; its old primary must not change it", self.settings.rank)));
        }
        match msg.meta.priority {
            kind::INIT => self.init(msg).map(drop)?,
            kind::ROUNDS => self.replicated_rounds(msg)?,
            kind::ASYNC => {
                let worker = u32::try_from(msg.meta.head).map_err(|_| bad(format!("worker rank {}", msg.meta.head)))?;
                let pull_back = false;
                self.push(u64::MAX, worker, msg, pull_back).map(drop)?;
            }
            kind::COMMAND => self.command(msg).map(drop)?,
            kind::BEGIN => {
                let begin: SnapBegin = serde_json::from_str(&msg.meta.text).map_err(|e| bad(format!("snapshot header: {e}")))?;
                self.keys.clear();
                self.pending.clear();
                self.open.clear();
                self.held = 0;
                self.sync = begin.sync;
                self.updater = match begin.optimizer {
                    None => None,
                    Some(json) => {
                        let opt = crate::optimizer::Optimizer::from_json(&json).map_err(|e| bad(format!("optimizer: {e}")))?;
                        Some(Updater::try_new(opt).map_err(|e| bad(format!("optimizer: {e}")))?)
                    }
                };
            }
            kind::ENTRIES => {
                let entries: Vec<SnapEntry> = serde_json::from_str(&msg.meta.text).map_err(|e| bad(format!("snapshot entries: {e}")))?;
                if entries.len() != msg.chunks.len() {
                    return Err(bad(format!("{} snapshot entries with {} values", entries.len(), msg.chunks.len())));
                }
                for (s, value) in entries.into_iter().zip(&msg.chunks) {
                    let mut e = Entry::from_checkpoint(&s.desc, &value.data)?;
                    e.round.id = s.desc.round;
                    e.async_next = s.async_next;
                    e.restored = s.restored;
                    e.round.holds = s.holds;
                    self.keys.insert((s.desc.ps, s.desc.offset), e);
                }
            }
            kind::STATES => {
                let u = self.updater.as_mut().ok_or_else(|| bad("optimizer states without an optimizer".into()))?;
                let page = msg.chunks.first().map_or(&[][..], |c| &c.data[..]);
                u.merge_states(page, false).map_err(|e| bad(format!("optimizer states: {e}")))?;
            }
            kind::HOLDS => self.replicated_holds(msg)?,
            kind::END => return Ok(true),
            other => return Err(bad(format!("unknown kind {other}"))),
        }
        Ok(false)
    }

    /// Sends the backup the holds worker `worker`'s rejoin left on key parts `keys` (none
    /// where the part's rounds reached the round it joined at already).
    pub(super) fn replicate_holds(&mut self, worker: Rank, keys: &[EntryKey]) {
        if !self.repl.active() {
            return;
        }
        let mut m = Message::new(Command::Replicate);
        m.meta.head = i32::try_from(worker).unwrap_or(i32::MAX);
        let mut moves = Vec::new();
        for &key in keys {
            let Some(hold) = self.keys.get(&key).and_then(|e| e.round.hold(worker).copied()) else { continue };
            m.meta.push_key(key.0, 0, key.1);
            m.meta.rounds.push(hold.from);
            moves.push(hold.moves);
        }
        if moves.is_empty() {
            return;
        }
        m.meta.text = serde_json::to_string(&moves).unwrap_or_default();
        self.repl.send(kind::HOLDS, m);
    }

    /// Takes the holds of a rejoined worker that its primary sent.
    fn replicated_holds(&mut self, msg: &Message) -> Result<(), ServerError> {
        let worker = Rank::try_from(msg.meta.head).map_err(|_| bad(format!("holds of worker rank {}", msg.meta.head)))?;
        let moves: Vec<u64> = serde_json::from_str(&msg.meta.text).map_err(|e| bad(format!("hold moves: {e}")))?;
        if moves.len() != msg.meta.keys.len() || msg.meta.rounds.len() != msg.meta.keys.len() {
            return Err(bad(format!(
                "{} hold moves and {} rounds for {} key parts",
                moves.len(),
                msg.meta.rounds.len(),
                msg.meta.keys.len()
            )));
        }
        for (i, moves) in moves.into_iter().enumerate() {
            let key = entry_key(msg, i);
            let entry = self.keys.get_mut(&key).ok_or_else(|| bad(format!("a hold on key part {key:?}, which this copy lacks")))?;
            entry.round.set_hold(Hold { worker, from: msg.meta.rounds[i], moves });
        }
        Ok(())
    }

    /// Applies a batch of completed rounds: each as the one part of a round.
    fn replicated_rounds(&mut self, msg: &Message) -> Result<(), ServerError> {
        let kinds: Vec<String> = serde_json::from_str(&msg.meta.text).map_err(|e| bad(format!("round kinds: {e}")))?;
        if kinds.len() != msg.meta.keys.len() || msg.meta.rounds.len() != msg.meta.keys.len() {
            return Err(bad(format!(
                "{} round kinds and {} round ids for {} keys",
                kinds.len(),
                msg.meta.rounds.len(),
                msg.meta.keys.len()
            )));
        }
        let mut chunks = msg.chunks.iter();
        for (i, k) in kinds.iter().enumerate() {
            let key = entry_key(msg, i);
            let entry = self.keys.get_mut(&key).ok_or_else(|| bad(format!("a round of key part {key:?}, which this copy lacks")))?;
            let mut next = || chunks.next().cloned().ok_or_else(|| bad("a round without its values".into()));
            match k.as_str() {
                "a" => entry.finish_dense(vec![Part::Raw(next()?)], false, None, None, None).map(drop)?,
                "u" => {
                    let u = self.updater.as_mut().ok_or_else(|| bad("an update without an optimizer".into()))?;
                    entry.finish_dense(vec![Part::Raw(next()?)], false, Some(Upd::Whole(u)), None, None).map(drop)?;
                }
                "ra" | "ru" => {
                    let ids = next()?;
                    let data = next()?;
                    let (_, cdt) = entry.dtypes();
                    let n = codec::chunk_len(&ids);
                    let indices = codec::ids_from_chunk(&ids, usize::MAX).map_err(|e| bad(e.to_string()))?;
                    if indices.len() != n {
                        return Err(bad("row ids".into()));
                    }
                    let data = codec::chunk_to_buffer(&data, cdt).map_err(|e| bad(e.to_string()))?;
                    let updater = if k == "ru" { self.updater.as_mut() } else { None };
                    entry.finish_rows(vec![RowSparse { indices, data }], updater, false)?;
                }
                other => return Err(bad(format!("round kind {other:?}"))),
            }
            entry.round.id = msg.meta.rounds[i];
            // As the primary does when a round completes: holds the round passed are dropped.
            entry.round.prune_holds(&self.done);
        }
        Ok(())
    }
}

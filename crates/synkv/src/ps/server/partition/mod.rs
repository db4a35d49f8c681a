//! The server's state machine, run on one dedicated thread (MXNet's server main thread): every
//! entry, every sync round, the optimizer, and the requests waiting for a round to complete.
//!
//! Connection tasks hand it [`Event`]s; it answers through each connection's bounded outbox
//! and never waits: a connection whose outbox is full (its worker does not read the replies
//! it asked for) is closed. Because one thread owns everything, updates of an entry never run
//! concurrently (spec K8.12) and need no locks. The update work runs on more threads: the
//! rounds one request completes update side by side (`batch.rs`, `SYNKV_SERVER_THREADS`), and
//! the kernels split large arrays.
//!
//! - **Init** (`Push` + `INIT`): creates the entries; one held already is refused
//!   ([`ErrorCode::DuplicateInit`]; MXNet would hang, K1.9).
//! - **Sync push** (K8.11): placed in a round by its round id (`round.rs`); pushes are held
//!   as they arrived and folded into the entry's accumulator when the server's budget of held
//!   bytes runs out, so memory does not grow with the number of workers. When every worker
//!   that has not finished has pushed, the update runs and every waiting request is answered
//!   (a `PushPull` with the updated value) once all of its keys are done.
//! - **Async push** (K8.12): applied on arrival, answered at once; without an optimizer the
//!   value is assigned (MXNet aborts the server instead, K12.21).
//! - **Pull**: answered at once with the current value (K4.6), sharing its memory.
//! - **Stragglers**: a round that waits longer than `SYNKV_STRAGGLER_WARN_MS` is reported —
//!   logged, and a `Notice` to the waiting workers naming the workers it waits for — at most
//!   once per that interval. Slow is not dead: nothing fails.
//! - **Commands**: see [`ServerCmd`] (optimizer states travel in pages, `states.rs`).

use std::collections::BTreeSet;
use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet, FxHashSet};
use std::time::Duration;

use tokio::time::Instant;

mod batch;
mod replica;
mod spans;

use self::replica::{kind, Replication, RoundChange};
use super::core::Settings;
use super::entry::{Applied, Checked, Entry, EntryKey, Part, Upd};
use super::error::ServerError;
use super::round::{take_async, Contribution, Place, ReqId};
use super::states::Pager;
use super::value::{entry_key, entry_keys, push_items};
use super::ServerCmd;
use crate::ndarray::RowSparse;
use crate::optimizer::{Optimizer, Updater};
use crate::ps::checkpoint::{write_shard, Shard, ShardHeader};
use crate::ps::cluster::Absent;
use crate::ps::node::Rank;
use crate::ps::proto::{Chunk, Command, ErrorCode, Flags, Message};
use crate::ps::trace::{Op, Span};
use crate::ps::transport::share::BroadcastHub;

/// A round's sum at least this large goes to the backup at once (its transfer overlaps the
/// update); smaller ones are batched with the event's other rounds.
const SEND_AT_ONCE: usize = 1 << 16;
/// A request waiting for the sync rounds of its keys.
struct Pending {
    request_id: u64,
    /// The request's priority, which its answer carries (the writer orders answers by it).
    priority: i32,
    pull_back: bool,
    keys: Vec<EntryKey>,
    values: Vec<Option<Chunk>>,
    remaining: usize,
    failed: Option<ServerError>,
}

/// A sync round taken for completion (`take_round`): what it held, and who waits for it.
struct Finished {
    key: EntryKey,
    round_id: u64,
    held: Vec<Part>,
    accumulated: bool,
    rows: Vec<RowSparse>,
    waiting: Vec<(ReqId, usize)>,
    failed: Option<ServerError>,
    /// Pushes that arrived for the next round meanwhile.
    queued: Vec<Contribution>,
}

/// What a round's update did, for the backup copy (`None`: nothing to send).
type RoundResult = Result<Option<RoundChange>, ServerError>;

/// Whether a partition serves requests or keeps a backup copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// This server holds the partition: it answers requests (and replicates to a backup).
    Primary,
    /// A backup copy, changed only by its primary's `Replicate` messages.
    Replica,
}

/// One server partition's state: the key parts the slicer places on server rank
/// `settings.rank`, their rounds, and its optimizer. A server has its own partition and, with
/// replicas, backup copies of others (and, after a failover, a dead server's partitions).
pub(super) struct Partition {
    pub(super) settings: Settings,
    pub(super) role: Role,
    sync: bool,
    keys: HashMap<EntryKey, Entry>,
    updater: Option<Updater>,
    pending: HashMap<ReqId, Pending>,
    /// Workers that finished or died.
    done: Absent,
    /// Bytes held by unfolded pushes, over every entry.
    held: usize,
    /// Entries with a round in progress.
    open: HashSet<EntryKey>,
    last_warning: Option<Instant>,
    pager: Pager,
    /// Messages to send, per connection, in order (the core delivers them).
    pub(super) out: Vec<(u64, Message)>,
    /// Replication to the backup copy, when there is one (`replica.rs`).
    pub(super) repl: Replication,
    /// Rounds completed by the request being handled whose updates wait to run together
    /// (`batch.rs`); `None` outside a batch.
    batch: Option<Vec<Finished>>,
}

type Outcome = Result<Option<Message>, ServerError>;

fn not_initialised(key: EntryKey) -> ServerError {
    let label = describe_key(key.0);
    let part = if key.1 == 0 { String::new() } else { format!(" (its part at {})", key.1) };
    ServerError::new(
        ErrorCode::NotInitialized,
        format!("key {label}{part} has not been initialised on this server; call init({label}, value) on every worker first (and cut keys alike on every worker: same MXNET_KVSTORE_BIGARRAY_BOUND and SYNKV_MAX_FRAME_BYTES)"),
    )
    .at(key)
}

impl Partition {
    pub(super) fn new(settings: Settings, role: Role) -> Partition {
        Partition {
            settings,
            role,
            sync: true,
            keys: HashMap::default(),
            updater: None,
            pending: HashMap::default(),
            done: Absent::default(),
            held: 0,
            open: HashSet::default(),
            last_warning: None,
            pager: Pager::default(),
            out: Vec::new(),
            repl: Replication::default(),
            batch: None,
        }
    }

    /// Key parts held.
    pub(super) fn num_keys(&self) -> usize {
        self.keys.len()
    }

    fn num_workers(&self) -> usize {
        usize::try_from(self.settings.num_workers).unwrap_or(usize::MAX)
    }

    /// Bytes held by unfolded pushes (for tests).
    #[cfg(test)]
    pub(super) fn held_bytes(&self) -> usize {
        self.held
    }

    /// A connection closed: its waiting requests are forgotten.
    pub(super) fn closed(&mut self, conn: u64) {
        self.pending.retain(|(c, _), _| *c != conn);
    }

    /// The workers that finished so far: rounds stop waiting for them.
    pub(super) fn workers_done(&mut self, done: &Absent) {
        self.done.clone_from(done);
        for entry in self.keys.values_mut() {
            if !entry.round.holds.is_empty() {
                entry.round.prune_holds(done);
            }
        }
        let open: Vec<EntryKey> = self.open.iter().copied().collect();
        self.open_batch();
        for key in open {
            self.maybe_complete(key);
        }
        self.run_batch();
        self.flush_replication();
    }

    /// A data request or command from worker `worker` on connection `conn`.
    pub(super) fn request(&mut self, conn: u64, worker: Rank, msg: &Message) {
        let id = msg.request_id;
        let m = &crate::ps::metrics::METRICS.server;
        m.requests.add(1);
        m.received_bytes.add(msg.chunks.iter().map(len_u64).sum());
        let outcome = match msg.command {
            Command::Push | Command::PushPull if msg.flags.contains(Flags::INIT) => self.init(msg),
            Command::Push => self.push(conn, worker, msg, false),
            Command::PushPull => self.push(conn, worker, msg, true),
            Command::Pull if msg.flags.contains(Flags::ROUND_IDS) => self.round_ids(worker, msg),
            Command::Pull => self.pull(worker, msg),
            Command::ServerCommand => self.command(msg),
            other => Err(ServerError::invalid(format!("a server does not accept {other:?}"))),
        };
        if outcome.is_ok() {
            self.replicate_request(worker, msg);
        }
        match outcome {
            Ok(Some(mut m)) => {
                if matches!(msg.command, Command::Push | Command::PushPull | Command::Pull) {
                    // Answers leave in their requests' priority order (`transport::writer`).
                    m.meta.priority = msg.meta.priority;
                }
                self.reply(conn, m.with_request_id(id))
            }
            Ok(None) => {}
            Err(e) => self.reply(conn, e.to_message(id)),
        }
        self.flush_replication();
    }

    /// Sends a request that changed the partition to the backup copy, as it came: an init,
    /// an async push (applied alike there), an optimizer or mode command. Sync pushes are
    /// replicated as completed rounds instead (`maybe_complete`).
    fn replicate_request(&mut self, worker: Rank, msg: &Message) {
        if !self.repl.active() {
            return;
        }
        match msg.command {
            Command::Push | Command::PushPull if msg.flags.contains(Flags::INIT) => self.repl.send(kind::INIT, msg.clone()),
            Command::Push | Command::PushPull if !self.sync => {
                let mut m = msg.clone();
                m.meta.head = i32::try_from(worker).unwrap_or(i32::MAX);
                self.repl.send(kind::ASYNC, m);
            }
            Command::ServerCommand
                if matches!(
                    ServerCmd::from_id(msg.meta.head),
                    Some(ServerCmd::SetOptimizer | ServerCmd::SyncMode | ServerCmd::SetOptimizerStates)
                ) =>
            {
                self.repl.send(kind::COMMAND, msg.clone());
            }
            _ => {}
        }
    }

    /// Sends the batch of rounds completed while handling an event.
    pub(super) fn flush_replication(&mut self) {
        self.repl.flush();
    }

    /// The backup acknowledged the replication messages up to `seq`.
    pub(super) fn acked(&mut self, seq: u64) {
        let released = self.repl.ack(seq);
        self.out.extend(released);
    }

    /// A new backup link (or none): sends it the whole partition.
    pub(super) fn set_backup(&mut self, me: crate::ps::node::NodeId, backup: Option<crate::ps::transport::Outbox>) {
        let partition = u16::try_from(self.settings.rank).unwrap_or(u16::MAX);
        let released = self.repl.set_backup(partition, me, backup);
        self.out.extend(released);
        if self.repl.active() {
            self.send_snapshot();
        }
    }

    /// The copy becomes the partition's primary (its primary died).
    pub(super) fn promote(&mut self) {
        self.role = Role::Primary;
    }

    /// Queues an answer: sent once every replication it may depend on is acknowledged.
    fn reply(&mut self, conn: u64, msg: Message) {
        crate::ps::metrics::METRICS.server.sent_bytes.add(msg.chunks.iter().map(len_u64).sum());
        match self.repl.gate() {
            Some(seq) => self.repl.gated.push_back((seq, conn, msg)),
            None => self.out.push((conn, msg)),
        }
    }

    fn init(&mut self, msg: &Message) -> Outcome {
        let items = push_items(msg)?;
        let names: Vec<String> = if msg.meta.text.is_empty() {
            items.iter().map(|it| describe_key(it.key.0)).collect()
        } else {
            serde_json::from_str(&msg.meta.text)
                .map_err(|e| ServerError::invalid(format!("init: key names are not a JSON list of strings: {e}")))?
        };
        if names.len() != items.len() {
            return Err(ServerError::invalid(format!("init: {} key names for {} keys", names.len(), items.len())));
        }
        let mut seen: FxHashSet<EntryKey> = FxHashSet::default();
        let mut claims = Vec::new();
        for (i, it) in items.iter().enumerate() {
            // A key restored from a checkpoint is claimed by the first init of the new run
            // (its value and optimizer state stay the checkpoint's).
            if let Some(entry) = self.keys.get(&it.key).filter(|e| e.restored) {
                if seen.insert(it.key) {
                    entry.matches_init(&it.value).map_err(|e| e.at(it.key))?;
                    claims.push(i);
                    continue;
                }
            }
            if self.keys.contains_key(&it.key) || !seen.insert(it.key) {
                return Err(ServerError::new(
                    ErrorCode::DuplicateInit,
                    format!(
                        "duplicate init of key {}; a key is initialised once (init or broadcast), use push to change its value",
                        names[i]
                    ),
                )
                .at(it.key));
            }
        }
        let mut entries = Vec::with_capacity(items.len());
        for (i, (it, name)) in items.into_iter().zip(names).enumerate() {
            if !claims.contains(&i) {
                entries.push((it.key, Entry::from_init(name, it.key.1, it.value).map_err(|e| e.at(it.key))?));
            }
        }
        for i in &claims {
            let key = entry_key(msg, *i);
            if let Some(e) = self.keys.get_mut(&key) {
                e.restored = false;
            }
        }
        self.keys.extend(entries);
        Ok(Some(Message::new(Command::Reply)))
    }

    fn push(&mut self, conn: u64, worker: Rank, msg: &Message, pull_back: bool) -> Outcome {
        if pull_back && msg.flags.contains(Flags::ROW_SPARSE) {
            return Err(ServerError::new(
                ErrorCode::StorageMismatch,
                "pushpull takes dense values only; push row_sparse values, then row_sparse_pull",
            ));
        }
        // Validate every key (values and round ids) before anything changes.
        let items = push_items(msg)?;
        let retry = msg.flags.contains(Flags::RETRY);
        let mut checked: Vec<(EntryKey, Option<u64>, Checked)> = Vec::with_capacity(items.len());
        // A retried push (sent again after a failover) of a round this partition completed
        // already — through its dead primary's replication — is acknowledged, not applied.
        let mut applied: Vec<bool> = Vec::with_capacity(items.len());
        let mut seen: FxHashSet<EntryKey> = FxHashSet::default();
        for it in items {
            if !seen.insert(it.key) {
                return Err(ServerError::invalid(format!("key {} appears twice in one request", describe_key(it.key.0))).at(it.key));
            }
            let entry = self.keys.get(&it.key).ok_or_else(|| not_initialised(it.key))?;
            let done = retry && self.sync && it.round.is_some_and(|r| r < entry.round.id);
            if self.sync && !done {
                entry.round.place(worker, it.round, &entry.name).map_err(|e| e.at(it.key))?;
            }
            checked.push((it.key, it.round, entry.check(it.value).map_err(|e| e.at(it.key))?));
            applied.push(done);
        }
        if !self.sync {
            return self.push_async(worker, checked, pull_back, retry);
        }
        let req = (conn, msg.request_id);
        if self.pending.contains_key(&req) {
            return Err(ServerError::invalid(format!("request id {} is already in use on this connection", msg.request_id)));
        }
        let n = checked.len();
        if n == 0 {
            return Ok(Some(Message::new(Command::Reply)));
        }
        let keys: Vec<EntryKey> = checked.iter().map(|(k, _, _)| *k).collect();
        let pending = Pending {
            request_id: msg.request_id,
            priority: msg.meta.priority,
            pull_back,
            keys,
            values: vec![None; n],
            remaining: n,
            failed: None,
        };
        self.pending.insert(req, pending);
        let rec = spans::recorder();
        // The rounds this push completes update together (`batch.rs`); nothing below returns
        // before `run_batch`.
        self.open_batch();
        for (slot, (key, round, value)) in checked.into_iter().enumerate() {
            let Some(entry) = self.keys.get_mut(&key) else { continue };
            let traced = rec.map(|_| {
                (std::time::Instant::now(), Arc::clone(&entry.label), round.unwrap_or(entry.round.id), spans::checked_bytes(&value))
            });
            if applied[slot] {
                let value = pull_back.then(|| entry.value_chunk());
                self.key_done(req, slot, Ok(value));
            } else {
                let place = entry.round.place(worker, round, &entry.name).unwrap_or(Place::Now);
                let round = match place {
                    Place::Now => entry.round.id,
                    Place::Later(r) => r,
                };
                let c = Contribution { worker, round, req, slot, value };
                match place {
                    Place::Now => self.contribute(key, c),
                    Place::Later(_) => entry.round.next.push(c),
                }
            }
            if let (Some(rec), Some((t, label, round, bytes))) = (rec, traced) {
                let end = std::time::Instant::now();
                rec.record(Span::new(Op::Push, t, end).key(&label, key.1).peer(worker).bytes(bytes).round(round));
            }
        }
        self.run_batch();
        Ok(None)
    }

    fn push_async(&mut self, worker: Rank, checked: Vec<(EntryKey, Option<u64>, Checked)>, pull_back: bool, retry: bool) -> Outcome {
        // A retried push already applied (see `push`): acknowledged, not applied again.
        let applied = |entry: &Entry, round: Option<u64>| {
            let next = entry.async_next.get(usize::try_from(worker).unwrap_or(usize::MAX)).copied().unwrap_or(0);
            retry && round.is_some_and(|r| r < next)
        };
        for (key, round, _) in &checked {
            let Some(entry) = self.keys.get(key) else { continue };
            if applied(entry, *round) {
                continue;
            }
            let mut next = entry.async_next.clone();
            take_async(&mut next, worker, *round, &entry.name).map_err(|e| e.at(*key))?;
        }
        let mut out = Message::new(Command::Reply);
        let rec = spans::recorder();
        for (key, round, value) in checked {
            let Some(entry) = self.keys.get_mut(&key) else { continue };
            if applied(entry, round) {
                if pull_back {
                    push_chunk(&mut out, key, entry.value_chunk());
                }
                continue;
            }
            let expected = entry.async_next.get(usize::try_from(worker).unwrap_or(usize::MAX)).copied().unwrap_or(0);
            take_async(&mut entry.async_next, worker, round, &entry.name).map_err(|e| e.at(key))?;
            let traced = rec.map(|r| (r, std::time::Instant::now(), spans::checked_bytes(&value)));
            let updater = self.updater.as_mut();
            let shared = self.settings.shared.as_deref().and_then(BroadcastHub::existing);
            let applied = match value {
                Checked::Dense(c) => entry.finish_dense(vec![Part::Raw(c)], false, updater.map(Upd::Whole), None, shared).map(drop),
                Checked::Packed(gc, c) => {
                    entry.finish_dense(vec![Part::Packed(gc, c)], false, updater.map(Upd::Whole), None, shared).map(drop)
                }
                Checked::Rows(ids, data) => {
                    let rows = entry.rows_of(ids, &data)?;
                    entry.finish_rows(vec![rows], updater, false).map(drop)
                }
            };
            if let Some((rec, t, bytes)) = traced {
                let span = Span::new(Op::Update, t, std::time::Instant::now()).key(&entry.label, key.1).peer(worker);
                rec.record(span.bytes(bytes).round(round.unwrap_or(expected)).ok(applied.is_ok()));
            }
            applied.map_err(|e| e.at(key))?;
            if pull_back {
                push_chunk(&mut out, key, entry.value_chunk());
            }
        }
        Ok(Some(out))
    }

    /// Adds one worker's push to an entry's current round; completes the round if it was the
    /// last one missing, else folds held pushes when the held budget is exceeded.
    fn contribute(&mut self, key: EntryKey, c: Contribution) {
        self.add(key, c);
        self.check(key);
    }

    /// Completes the entry's round if every push is in, else folds held pushes when the held
    /// budget is exceeded.
    fn check(&mut self, key: EntryKey) {
        if !self.maybe_complete(key) && self.held > self.settings.held_budget {
            self.fold(key);
        }
    }

    /// Adds one worker's push to an entry's current round.
    fn add(&mut self, key: EntryKey, c: Contribution) {
        let Some(entry) = self.keys.get_mut(&key) else { return };
        let round = &mut entry.round;
        match c.value {
            Checked::Dense(chunk) => {
                let part = Part::Raw(chunk);
                round.held_bytes += part.bytes();
                self.held += part.bytes();
                round.held.push(part);
            }
            Checked::Packed(gc, words) => {
                let part = Part::Packed(gc, words);
                round.held_bytes += part.bytes();
                self.held += part.bytes();
                round.held.push(part);
            }
            Checked::Rows(ids, data) => match entry.rows_of(ids, &data) {
                Ok(rows) => entry.round.rows.push(rows),
                Err(e) => return self.key_done(c.req, c.slot, Err(e.at(key))),
            },
        }
        let round = &mut entry.round;
        round.contributors.insert(c.worker);
        round.waiting.push((c.req, c.slot));
        round.started.get_or_insert_with(Instant::now);
        self.open.insert(key);
    }

    /// Folds an entry's held pushes into its accumulator, releasing their frames.
    fn fold(&mut self, key: EntryKey) {
        let Some(entry) = self.keys.get_mut(&key) else { return };
        let parts = std::mem::take(&mut entry.round.held);
        let bytes = std::mem::take(&mut entry.round.held_bytes);
        self.held = self.held.saturating_sub(bytes);
        if parts.is_empty() {
            return;
        }
        let first = !entry.round.accumulated;
        entry.round.accumulated = true;
        let started = std::time::Instant::now();
        let folded = entry.fold(parts, first);
        if let Some(rec) = spans::recorder() {
            let span = Span::new(Op::Sum, started, std::time::Instant::now()).key(&entry.label, key.1);
            rec.record(span.bytes(u64::try_from(bytes).unwrap_or(u64::MAX)).round(entry.round.id).ok(folded.is_ok()));
        }
        if let Err(e) = folded {
            // Every waiting request of this round learns it when the round completes.
            entry.round.failed.get_or_insert(e.at(key));
        }
    }

    /// Completes the entry's round (and the queued ones after it) while every worker that has
    /// not finished has pushed. Returns whether a round completed. While a batch is open
    /// (`batch.rs`) a dense round's update waits in it, to run beside the others'.
    fn maybe_complete(&mut self, key: EntryKey) -> bool {
        let mut any = false;
        while let Some(mut f) = self.take_round(key) {
            any = true;
            if self.batch.is_some() && self.batchable(&f) {
                if let Some(batch) = self.batch.as_mut() {
                    batch.push(f);
                }
                return true;
            }
            let result = self.run_round(&mut f);
            self.settle(f, result);
        }
        any
    }

    /// The entry's round, taken for completion if every worker that has not finished pushed
    /// to it: the entry moves on to the next round.
    fn take_round(&mut self, key: EntryKey) -> Option<Finished> {
        let num_workers = self.num_workers();
        let entry = self.keys.get_mut(&key)?;
        if !entry.round.complete(num_workers, &self.done) {
            return None;
        }
        let round = &mut entry.round;
        self.held = self.held.saturating_sub(std::mem::take(&mut round.held_bytes));
        round.contributors.clear();
        if let Some(started) = round.started.take() {
            crate::ps::metrics::METRICS.server.round_wait.observe(started.elapsed());
        }
        let f = Finished {
            key,
            round_id: round.id,
            held: std::mem::take(&mut round.held),
            accumulated: std::mem::take(&mut round.accumulated),
            rows: std::mem::take(&mut round.rows),
            waiting: std::mem::take(&mut round.waiting),
            failed: round.failed.take(),
            queued: std::mem::take(&mut round.next),
        };
        round.id += 1;
        if !round.holds.is_empty() {
            round.prune_holds(&self.done);
        }
        self.open.remove(&key);
        Some(f)
    }

    /// Runs a taken round's update on this thread: the sum, and the updater (or the assign).
    fn run_round(&mut self, f: &mut Finished) -> RoundResult {
        let key = f.key;
        let Some(entry) = self.keys.get_mut(&key) else { return Ok(None) };
        let update_started = std::time::Instant::now();
        let replicating = self.repl.active();
        let rec = spans::recorder();
        // When the sum was complete and the updater started (dense rounds, traced).
        let mut summed_at = None;
        let result = match f.failed.take() {
            Some(e) => Err(e),
            None if entry.is_rows() => {
                let update = self.updater.is_some();
                let rows = std::mem::take(&mut f.rows);
                entry.finish_rows(rows, self.updater.as_mut(), replicating).map(|sum| sum.map(|s| RoundChange::Rows(s, update)))
            }
            None => {
                // An update's sum is sent to the backup before the update runs, so the
                // transfer overlaps it; an assign sends the new value after.
                let (repl, id, page) = (&mut self.repl, entry.round.id, self.settings.page_bytes);
                let mut send_sum = |sum: Chunk| {
                    if rec.is_some() {
                        summed_at = Some(std::time::Instant::now());
                    }
                    if !replicating {
                        return;
                    }
                    let big = sum.data.len() >= SEND_AT_ONCE;
                    repl.add_round(key, id, RoundChange::Update(sum), page);
                    if big {
                        repl.flush();
                    }
                };
                let on_sum: Option<&mut dyn FnMut(Chunk)> = if replicating || rec.is_some() { Some(&mut send_sum) } else { None };
                let shared = self.settings.shared.as_deref().and_then(BroadcastHub::existing);
                let held = std::mem::take(&mut f.held);
                entry.finish_dense(held, f.accumulated, self.updater.as_mut().map(Upd::Whole), on_sum, shared).map(
                    |applied| match applied {
                        Applied::Assign if replicating => Some(RoundChange::Assign(entry.value_chunk())),
                        _ => None,
                    },
                )
            }
        }
        .map_err(|e| e.at(key));
        crate::ps::metrics::METRICS.server.update.observe(update_started.elapsed());
        if let Some(rec) = rec {
            let times = (update_started, summed_at, std::time::Instant::now());
            let bytes = entry.byte_len();
            spans::round(rec, (&entry.label, key.1), f.round_id, bytes, times, self.updater.is_some(), result.is_ok());
        }
        result
    }

    /// After a round's update: the backup copy gets the round before anyone hears of it
    /// (replies wait for it), the waiting requests are answered, and the pushes that waited
    /// for this round start the next one.
    fn settle(&mut self, f: Finished, result: RoundResult) {
        let key = f.key;
        let Some(entry) = self.keys.get(&key) else { return };
        let next_id = entry.round.id;
        let result = match result {
            Ok(change) => {
                if let Some(change) = change {
                    self.repl.add_round(key, next_id, change, self.settings.page_bytes);
                }
                Ok(())
            }
            Err(e) => Err(e),
        };
        let wants_value = f.waiting.iter().any(|(r, _)| self.pending.get(r).is_some_and(|p| p.pull_back));
        let value = (wants_value && result.is_ok()).then(|| entry.value_chunk());
        for (req, slot) in f.waiting {
            let outcome = match (&result, &value) {
                (Err(e), _) => Err(e.clone()),
                (Ok(()), v) => Ok(v.clone()),
            };
            self.key_done(req, slot, outcome);
        }
        // Every push queued for the new round is in before it may complete.
        let mut added = false;
        for c in f.queued {
            if c.round == next_id {
                self.add(key, c);
                added = true;
            } else if let Some(entry) = self.keys.get_mut(&key) {
                // A rejoined worker's push for a round further on.
                entry.round.next.push(c);
            }
        }
        if added {
            self.check(key);
        }
    }

    /// One key of a waiting request is done; answers the request when all of its keys are.
    fn key_done(&mut self, req: ReqId, slot: usize, outcome: Result<Option<Chunk>, ServerError>) {
        let Some(p) = self.pending.get_mut(&req) else { return };
        match outcome {
            Ok(value) => {
                if let Some(v) = p.values.get_mut(slot) {
                    *v = value;
                }
            }
            Err(e) => {
                p.failed.get_or_insert(e);
            }
        }
        p.remaining = p.remaining.saturating_sub(1);
        if p.remaining > 0 {
            return;
        }
        let Some(p) = self.pending.remove(&req) else { return };
        let msg = match p.failed {
            Some(e) => e.to_message(p.request_id),
            None => {
                let mut out = Message::new(Command::Reply).with_request_id(p.request_id);
                out.meta.priority = p.priority;
                if p.pull_back {
                    for (key, value) in p.keys.iter().zip(p.values) {
                        if let Some(chunk) = value {
                            push_chunk(&mut out, *key, chunk);
                        }
                    }
                }
                out
            }
        };
        self.reply(req.0, msg);
    }

    fn pull(&mut self, worker: Rank, msg: &Message) -> Outcome {
        let rows = msg.flags.contains(Flags::ROW_SPARSE);
        if rows && msg.chunks.len() != msg.meta.keys.len() {
            return Err(ServerError::invalid(format!("a row_sparse pull of {} keys needs one row-id chunk per key", msg.meta.keys.len())));
        }
        let mut out = Message::new(Command::Reply);
        let rec = spans::recorder();
        for (i, key) in entry_keys(msg).into_iter().enumerate() {
            let started = rec.map(|_| std::time::Instant::now());
            let entry = self.keys.get(&key).ok_or_else(|| not_initialised(key))?;
            if rows {
                let [ids, data] = entry.rows_chunks(&msg.chunks[i]).map_err(|e| e.at(key))?;
                out.meta.push_key(key.0, len_u64(&ids) + len_u64(&data), key.1);
                out.chunks.extend([ids, data]);
            } else {
                let want = msg.meta.lens.get(i).copied().unwrap_or(0);
                if want != entry.byte_len() {
                    let text =
                        format!("pull of key {}: the key holds {} bytes here, the request expects {want}", entry.name, entry.byte_len());
                    return Err(ServerError::new(ErrorCode::ShapeMismatch, text).at(key));
                }
                push_chunk(&mut out, key, entry.value_chunk());
            }
            if let (Some(rec), Some(t)) = (rec, started) {
                let bytes = out.meta.lens.last().copied().unwrap_or(0);
                let span = Span::new(Op::Pull, t, std::time::Instant::now()).key(&entry.label, key.1).peer(worker).bytes(bytes);
                rec.record(span.round(entry.round.id.saturating_sub(1)));
            }
        }
        Ok(Some(out))
    }

    /// The round id worker `worker`'s next push of each key part must carry (flag
    /// `ROUND_IDS`): what a restarted worker continues from. Sync: the round after every one it
    /// has pushed to (open, queued or completed); async: its next id.
    ///
    /// With `meta.rounds` (one per key, sync only), the worker *rejoins* each part at that round
    /// ([`Round::rejoin`](super::round::Round::rejoin)): the rounds below it complete without
    /// it, the rounds from it on wait for it. The reply says the round its next push must
    /// carry: the one asked for, or a later one where this part moved past it already.
    fn round_ids(&mut self, worker: Rank, msg: &Message) -> Outcome {
        let keys = entry_keys(msg);
        let rejoin = !msg.meta.rounds.is_empty();
        if rejoin && (msg.meta.rounds.len() != keys.len() || !self.sync) {
            return Err(ServerError::invalid(format!(
                "a rejoin names one round per key part in sync mode ({} rounds for {} key parts{})",
                msg.meta.rounds.len(),
                keys.len(),
                if self.sync { "" } else { ", and this server is in async mode" }
            )));
        }
        if let Some(key) = keys.iter().find(|k| !self.keys.contains_key(k)) {
            return Err(not_initialised(*key));
        }
        let mut out = Message::new(Command::Reply);
        let w = usize::try_from(worker).unwrap_or(usize::MAX);
        if rejoin {
            self.open_batch();
        }
        for (i, &key) in keys.iter().enumerate() {
            let Some(entry) = self.keys.get_mut(&key) else { continue };
            let next = if !self.sync {
                entry.async_next.get(w).copied().unwrap_or(0)
            } else if rejoin {
                let from = msg.meta.rounds[i];
                let next = entry.round.rejoin(worker, from, self.done.moves);
                self.maybe_complete(key);
                next
            } else {
                entry.round.expected(worker)
            };
            out.meta.push_key(key.0, 0, key.1);
            out.meta.rounds.push(next);
        }
        if rejoin {
            self.run_batch();
            self.replicate_holds(worker, &keys);
        }
        Ok(Some(out))
    }

    fn command(&mut self, msg: &Message) -> Outcome {
        let body: &[u8] = msg.chunks.first().map_or(&[], |c| &c.data[..]);
        let text = || std::str::from_utf8(body).map_err(|_| ServerError::invalid("the command body is not UTF-8"));
        let reply = Message::new(Command::Reply);
        match ServerCmd::from_id(msg.meta.head) {
            Some(ServerCmd::SetOptimizer) => {
                let opt =
                    Optimizer::from_json(text()?).map_err(|e| ServerError::new(ErrorCode::Optimizer, format!("set_optimizer: {e}")))?;
                // The same optimizer again (every worker sends it) keeps the states.
                if self.updater.as_ref().is_some_and(|u| *u.optimizer() == opt) {
                    return Ok(Some(reply));
                }
                self.updater =
                    Some(Updater::try_new(opt).map_err(|e| ServerError::new(ErrorCode::Optimizer, format!("set_optimizer: {e}")))?);
                self.pager = Pager::default();
                Ok(Some(reply))
            }
            Some(ServerCmd::SyncMode) => {
                self.sync = match text()? {
                    "sync" => true,
                    "async" => false,
                    other => return Err(ServerError::invalid(format!("unknown sync mode {other:?}; expected sync or async"))),
                };
                Ok(Some(reply))
            }
            Some(ServerCmd::GetOptimizerStates) => {
                let u = self.updater.as_ref().ok_or_else(no_optimizer)?;
                self.pager.page(u, body, self.settings.page_bytes).map(Some)
            }
            Some(ServerCmd::SetOptimizerStates) => {
                let u = self.updater.as_mut().ok_or_else(no_optimizer)?;
                self.pager.load(u, body, &msg.meta.text).map(Some)
            }
            Some(ServerCmd::Checkpoint) => self.checkpoint(body).map(Some),
            Some(ServerCmd::Stats) => {
                let stats = super::states::stats(self.keys.len(), self.held, self.pending.len());
                let mut reply = reply;
                reply.chunks.push(Chunk::bytes(stats.into_bytes()));
                Ok(Some(reply))
            }
            None => Err(ServerError::invalid(format!("unknown server command id {}", msg.meta.head))),
        }
    }

    /// Writes this server's shard of a checkpoint (body: JSON `{"dir": path, "id": n}`); the
    /// reply's chunk 0 is the shard's [`ShardFile`] as JSON. Called while every worker waits
    /// at a barrier with its own operations done, so no round is partly summed.
    fn checkpoint(&mut self, body: &[u8]) -> Result<Message, ServerError> {
        #[derive(serde::Deserialize)]
        struct Request {
            dir: std::path::PathBuf,
            id: u64,
        }
        let req: Request = serde_json::from_slice(body)
            .map_err(|e| ServerError::invalid(format!("checkpoint: the body is not {{\"dir\": path, \"id\": n}}: {e}")))?;
        let mut keys: Vec<EntryKey> = self.keys.keys().copied().collect();
        keys.sort_unstable();
        let (mut entries, mut values) = (Vec::with_capacity(keys.len()), Vec::with_capacity(keys.len()));
        for k in &keys {
            if let Some(e) = self.keys.get(k) {
                entries.push(e.desc(*k));
                values.push(e.value_bytes());
            }
        }
        let states = self.updater.as_ref().map(Updater::save_states).unwrap_or_default();
        let header = ShardHeader {
            rank: self.settings.rank,
            num_servers: self.settings.num_servers,
            id: req.id,
            sync: self.sync,
            optimizer: self.updater.as_ref().map(|u| u.optimizer().to_json()),
            entries,
            states_len: states.len() as u64,
        };
        let file = write_shard(&req.dir, &header, &values, &states).map_err(|e| ServerError::invalid(format!("checkpoint: {e}")))?;
        tracing::info!("wrote checkpoint {} shard: {} key parts, {} bytes", req.id, keys.len(), file.bytes);
        let mut reply = Message::new(Command::Reply);
        reply.chunks.push(Chunk::bytes(serde_json::to_vec(&file).unwrap_or_default()));
        Ok(reply)
    }

    /// Restores a checkpoint's shard (before any worker connects): its key parts (their rounds
    /// start over), its mode, and its optimizer with its states. Returns the key parts restored.
    pub(super) fn restore(&mut self, shard: Shard) -> Result<usize, ServerError> {
        let Shard { header, values, states } = shard;
        for (desc, bytes) in header.entries.iter().zip(&values) {
            self.keys.insert((desc.ps, desc.offset), Entry::from_checkpoint(desc, bytes)?);
        }
        self.sync = header.sync;
        if let Some(json) = &header.optimizer {
            let opt =
                Optimizer::from_json(json).map_err(|e| ServerError::new(ErrorCode::Optimizer, format!("checkpoint optimizer: {e}")))?;
            let mut u = Updater::try_new(opt).map_err(|e| ServerError::new(ErrorCode::Optimizer, format!("checkpoint optimizer: {e}")))?;
            if !states.is_empty() {
                u.merge_states(&states, true).map_err(|e| ServerError::new(ErrorCode::Optimizer, format!("checkpoint states: {e}")))?;
            }
            self.updater = Some(u);
        }
        Ok(header.entries.len())
    }

    /// Reports rounds that wait longer than the straggler bound (at most once per bound).
    pub(super) fn report_stragglers(&mut self, now: Instant) {
        let bound = self.settings.straggler_warn;
        if self.last_warning.is_some_and(|t| now.saturating_duration_since(t) < bound) {
            return;
        }
        let mut late: Vec<(EntryKey, Duration)> = self
            .open
            .iter()
            .filter_map(|k| {
                let started = self.keys.get(k)?.round.started?;
                let waited = now.saturating_duration_since(started);
                (waited >= bound).then_some((*k, waited))
            })
            .collect();
        if late.is_empty() {
            return;
        }
        late.sort_by_key(|l| std::cmp::Reverse(l.1));
        let (key, waited) = late[0];
        let Some(entry) = self.keys.get(&key) else { return };
        let missing = entry.round.missing(self.settings.num_workers, &self.done);
        let ranks = missing.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        let others = if late.len() > 1 { format!(" (and {} other key parts)", late.len() - 1) } else { String::new() };
        let text = format!(
            "straggler: sync round {} of key {}{others} has waited {:.0} s for worker rank {ranks} (of {} workers); slow is not dead: it goes on waiting while every node is alive",
            entry.round.id,
            entry.name,
            waited.as_secs_f64(),
            self.settings.num_workers
        );
        tracing::warn!("{text}");
        crate::ps::metrics::METRICS.server.stragglers.add(1);
        self.last_warning = Some(now);
        let conns: BTreeSet<u64> =
            late.iter().filter_map(|(k, _)| self.keys.get(k)).flat_map(|e| e.round.waiting.iter().map(|(r, _)| r.0)).collect();
        for conn in conns {
            self.out.push((conn, Message::notice(text.clone())));
        }
    }
}

fn no_optimizer() -> ServerError {
    ServerError::new(ErrorCode::NoOptimizer, "no optimizer is installed on this server; call set_optimizer first")
}

fn len_u64(c: &Chunk) -> u64 {
    u64::try_from(c.data.len()).unwrap_or(u64::MAX)
}

fn push_chunk(out: &mut Message, key: EntryKey, chunk: Chunk) {
    out.meta.push_key(key.0, len_u64(&chunk), key.1);
    out.chunks.push(chunk);
}

/// A ps key for messages: an int key as the user wrote it, a str key by its hash.
pub(super) fn describe_key(key: u64) -> String {
    match u32::try_from(key) {
        Ok(k) => i32::from_ne_bytes(k.to_ne_bytes()).to_string(),
        Err(_) => format!("#{key:016x}"),
    }
}

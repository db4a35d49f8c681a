//! The server's state machine, run on one dedicated thread (MXNet's server main thread): every
//! entry, every sync round, the optimizer, and the requests waiting for a round to complete.
//!
//! Connection tasks hand it [`Event`]s; it answers through each connection's bounded outbox
//! and never waits: a connection whose outbox is full (its worker does not read the replies
//! it asked for) is closed. Because one thread owns everything, updates of an entry never run
//! concurrently (spec K8.12) and need no locks; the kernels parallelise large arrays.
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

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet, FxHashSet};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::entry::{Checked, Entry, EntryKey, Part};
use super::error::ServerError;
use super::round::{take_async, Contribution, Place, ReqId};
use super::states::Pager;
use super::value::{entry_key, entry_keys, push_items};
use super::ServerCmd;
use crate::optimizer::{Optimizer, Updater};
use crate::ps::checkpoint::{write_shard, Shard, ShardHeader};
use crate::ps::node::{NodeId, Rank};
use crate::ps::proto::{Chunk, Command, ErrorCode, Flags, Message};
use crate::ps::transport::{Admission, Outbox};

/// What connection tasks and timers tell the core.
pub(super) enum Event {
    /// A worker's connection is authenticated: where its replies go, and how to close it.
    Opened { conn: u64, outbox: Outbox, close: CancellationToken },
    /// A data request or command from worker `worker`; `admission` returns the frame's
    /// ingress bytes once the core has handled it.
    Request { conn: u64, worker: Rank, msg: Message, admission: Admission },
    /// The connection ended; its waiting requests are forgotten.
    Closed { conn: u64 },
    /// The workers that finished so far (they push no more).
    WorkersDone(BTreeSet<Rank>),
    /// A clock tick (straggler reports).
    Tick,
    /// A message for every connection (a server's last word before it stops).
    Broadcast(Message),
}

/// A request waiting for the sync rounds of its keys.
struct Pending {
    request_id: u64,
    pull_back: bool,
    keys: Vec<EntryKey>,
    values: Vec<Option<Chunk>>,
    remaining: usize,
    failed: Option<ServerError>,
}

/// Settings of the core.
#[derive(Clone, Debug)]
pub(super) struct Settings {
    /// This server's rank and the number of servers (named in checkpoints).
    pub(super) rank: u32,
    pub(super) num_servers: u32,
    pub(super) num_workers: u32,
    /// Bytes of pushes held (not folded) across all entries before folding starts.
    pub(super) held_budget: usize,
    /// How long a round may wait before it is reported.
    pub(super) straggler_warn: Duration,
    /// Largest optimizer-state page (bytes).
    pub(super) page_bytes: usize,
}

/// All of a server's state.
pub(super) struct Core {
    me: NodeId,
    settings: Settings,
    sync: bool,
    keys: HashMap<EntryKey, Entry>,
    updater: Option<Updater>,
    pending: HashMap<ReqId, Pending>,
    conns: HashMap<u64, (Outbox, CancellationToken)>,
    /// Workers that finished.
    done: BTreeSet<Rank>,
    /// Bytes held by unfolded pushes, over every entry.
    held: usize,
    /// Entries with a round in progress.
    open: HashSet<EntryKey>,
    last_warning: Option<Instant>,
    pager: Pager,
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

impl Core {
    pub(super) fn new(me: NodeId, settings: Settings) -> Core {
        Core {
            me,
            settings,
            sync: true,
            keys: HashMap::default(),
            updater: None,
            pending: HashMap::default(),
            conns: HashMap::default(),
            done: BTreeSet::new(),
            held: 0,
            open: HashSet::default(),
            last_warning: None,
            pager: Pager::default(),
        }
    }

    /// Handles events until every sender is gone.
    pub(super) fn run(mut self, mut events: mpsc::Receiver<Event>) {
        while let Some(ev) = events.blocking_recv() {
            self.on_event(ev);
        }
    }

    fn num_workers(&self) -> usize {
        usize::try_from(self.settings.num_workers).unwrap_or(usize::MAX)
    }

    /// Bytes held by unfolded pushes (for stats and tests).
    #[cfg(test)]
    pub(super) fn held_bytes(&self) -> usize {
        self.held
    }

    pub(super) fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Opened { conn, outbox, close } => {
                self.conns.insert(conn, (outbox, close));
            }
            Event::Closed { conn } => {
                self.conns.remove(&conn);
                self.pending.retain(|(c, _), _| *c != conn);
            }
            Event::WorkersDone(done) => {
                self.done = done;
                let open: Vec<EntryKey> = self.open.iter().copied().collect();
                for key in open {
                    self.maybe_complete(key);
                }
            }
            Event::Tick => self.report_stragglers(Instant::now()),
            Event::Broadcast(msg) => {
                let conns: Vec<u64> = self.conns.keys().copied().collect();
                for conn in conns {
                    self.send(conn, msg.clone());
                }
            }
            Event::Request { conn, worker, msg, admission } => {
                let id = msg.request_id;
                let outcome = match msg.command {
                    Command::Push | Command::PushPull if msg.flags.contains(Flags::INIT) => self.init(&msg),
                    Command::Push => self.push(conn, worker, &msg, false),
                    Command::PushPull => self.push(conn, worker, &msg, true),
                    Command::Pull => self.pull(&msg),
                    Command::ServerCommand => self.command(&msg),
                    other => Err(ServerError::invalid(format!("a server does not accept {other:?}"))),
                };
                // The frame is handled: held pushes are accounted by the held budget now.
                drop(admission);
                match outcome {
                    Ok(Some(m)) => self.send(conn, m.with_request_id(id)),
                    Ok(None) => {}
                    Err(e) => self.send(conn, e.to_message(id)),
                }
            }
        }
    }

    fn send(&mut self, conn: u64, msg: Message) {
        let Some((outbox, close)) = self.conns.get(&conn) else { return };
        if let Err(e) = outbox.try_send(msg.with_sender(self.me)) {
            // A connection gone is seen by its worker; one that does not read is closed.
            tracing::warn!("closing data connection {conn}: {e}");
            close.cancel();
            self.conns.remove(&conn);
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
        let mut checked: Vec<(EntryKey, Option<u64>, Checked)> = Vec::with_capacity(items.len());
        let mut seen: FxHashSet<EntryKey> = FxHashSet::default();
        for it in items {
            if !seen.insert(it.key) {
                return Err(ServerError::invalid(format!("key {} appears twice in one request", describe_key(it.key.0))).at(it.key));
            }
            let entry = self.keys.get(&it.key).ok_or_else(|| not_initialised(it.key))?;
            if self.sync {
                entry.round.place(worker, it.round, &entry.name).map_err(|e| e.at(it.key))?;
            }
            checked.push((it.key, it.round, entry.check(it.value).map_err(|e| e.at(it.key))?));
        }
        if !self.sync {
            return self.push_async(worker, checked, pull_back);
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
        let pending = Pending { request_id: msg.request_id, pull_back, keys, values: vec![None; n], remaining: n, failed: None };
        self.pending.insert(req, pending);
        for (slot, (key, round, value)) in checked.into_iter().enumerate() {
            let Some(entry) = self.keys.get_mut(&key) else { continue };
            let place = entry.round.place(worker, round, &entry.name).unwrap_or(Place::Now);
            let c = Contribution { worker, req, slot, value };
            match place {
                Place::Now => self.contribute(key, c),
                Place::Next => entry.round.next.push(c),
            }
        }
        Ok(None)
    }

    fn push_async(&mut self, worker: Rank, checked: Vec<(EntryKey, Option<u64>, Checked)>, pull_back: bool) -> Outcome {
        for (key, round, _) in &checked {
            let Some(entry) = self.keys.get(key) else { continue };
            let mut next = entry.async_next.clone();
            take_async(&mut next, worker, *round, &entry.name).map_err(|e| e.at(*key))?;
        }
        let mut out = Message::new(Command::Reply);
        for (key, round, value) in checked {
            let Some(entry) = self.keys.get_mut(&key) else { continue };
            take_async(&mut entry.async_next, worker, round, &entry.name).map_err(|e| e.at(key))?;
            let updater = self.updater.as_mut();
            match value {
                Checked::Dense(c) => entry.finish_dense(vec![Part::Raw(c)], false, updater),
                Checked::Packed(gc, c) => entry.finish_dense(vec![Part::Packed(gc, c)], false, updater),
                Checked::Rows(ids, data) => {
                    let rows = entry.rows_of(ids, &data)?;
                    entry.finish_rows(vec![rows], updater)
                }
            }
            .map_err(|e| e.at(key))?;
            if pull_back {
                push_chunk(&mut out, key, entry.value_chunk());
            }
        }
        Ok(Some(out))
    }

    /// Adds one worker's push to an entry's current round; completes the round if it was the
    /// last one missing, else folds held pushes when the held budget is exceeded.
    fn contribute(&mut self, key: EntryKey, c: Contribution) {
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
        if !self.maybe_complete(key) && self.held > self.settings.held_budget {
            self.fold(key);
        }
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
        if let Err(e) = entry.fold(parts, first) {
            // Every waiting request of this round learns it when the round completes.
            entry.round.failed.get_or_insert(e.at(key));
        }
    }

    /// Completes the entry's round (and the queued ones after it) while every worker that has
    /// not finished has pushed. Returns whether a round completed.
    fn maybe_complete(&mut self, key: EntryKey) -> bool {
        let mut any = false;
        loop {
            let num_workers = self.num_workers();
            let Some(entry) = self.keys.get_mut(&key) else { return any };
            if !entry.round.complete(num_workers, &self.done) {
                return any;
            }
            any = true;
            let round = &mut entry.round;
            let held = std::mem::take(&mut round.held);
            self.held = self.held.saturating_sub(std::mem::take(&mut round.held_bytes));
            let accumulated = std::mem::take(&mut round.accumulated);
            let rows = std::mem::take(&mut round.rows);
            let waiting = std::mem::take(&mut round.waiting);
            let failed = round.failed.take();
            round.contributors.clear();
            round.started = None;
            round.id += 1;
            let result = match failed {
                Some(e) => Err(e),
                None if entry.is_rows() => entry.finish_rows(rows, self.updater.as_mut()),
                None => entry.finish_dense(held, accumulated, self.updater.as_mut()),
            }
            .map_err(|e| e.at(key));
            let wants_value = waiting.iter().any(|(r, _)| self.pending.get(r).is_some_and(|p| p.pull_back));
            let value = (wants_value && result.is_ok()).then(|| entry.value_chunk());
            let queued = std::mem::take(&mut entry.round.next);
            self.open.remove(&key);
            for (req, slot) in waiting {
                let outcome = match (&result, &value) {
                    (Err(e), _) => Err(e.clone()),
                    (Ok(()), v) => Ok(v.clone()),
                };
                self.key_done(req, slot, outcome);
            }
            // The pushes that waited for this round start the next one.
            for c in queued {
                self.contribute(key, c);
            }
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
        self.send(req.0, msg);
    }

    fn pull(&mut self, msg: &Message) -> Outcome {
        let rows = msg.flags.contains(Flags::ROW_SPARSE);
        if rows && msg.chunks.len() != msg.meta.keys.len() {
            return Err(ServerError::invalid(format!("a row_sparse pull of {} keys needs one row-id chunk per key", msg.meta.keys.len())));
        }
        let mut out = Message::new(Command::Reply);
        for (i, key) in entry_keys(msg).into_iter().enumerate() {
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
    fn report_stragglers(&mut self, now: Instant) {
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
        self.last_warning = Some(now);
        let conns: BTreeSet<u64> =
            late.iter().filter_map(|(k, _)| self.keys.get(k)).flat_map(|e| e.round.waiting.iter().map(|(r, _)| r.0)).collect();
        for conn in conns {
            self.send(conn, Message::notice(text.clone()));
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

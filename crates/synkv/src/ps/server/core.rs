//! The server's state machine, run on one dedicated thread (MXNet's server main thread): every
//! key, every sync round, the optimizer, and the requests waiting for a round to complete.
//!
//! Connection tasks hand it [`Event`]s; it answers through each connection's outbox. Because
//! one thread owns everything, updates of a key never run concurrently (spec K8.12) and need
//! no locks; the kernels it calls parallelise large arrays themselves.
//!
//! - **Init** (`Push` + `INIT`): creates the keys; a key held already is refused with an error
//!   naming it (MXNet would hang, K1.9).
//! - **Sync push** (K8.11, K12.10 fixed): a round of a key merges exactly one push per worker
//!   rank; a second push from a worker already in the round waits for the next round. When
//!   `num_workers` distinct workers have pushed, the update runs and every waiting request is
//!   answered (a `PushPull` with the updated value) once all of its keys are done.
//! - **Async push** (K8.12): applied on arrival, answered at once; without an optimizer the
//!   value is assigned (MXNet aborts the server instead, K12.21).
//! - **Pull**: answered at once with the current value (K4.6).
//! - **Commands**: see [`ServerCmd`].

use std::collections::HashMap;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::keys::{push_values, Checked, Contribution, Entry, ReqId};
use super::ServerCmd;
use crate::optimizer::{Optimizer, Updater};
use crate::ps::node::{NodeId, Rank};
use crate::ps::proto::{Chunk, Command, Flags, Message};

/// A connection's queue of outgoing messages.
pub(super) type Outbox = mpsc::UnboundedSender<Message>;

/// What connection tasks tell the core.
pub(super) enum Event {
    /// A data request or command from worker `worker`.
    Request { conn: u64, worker: Rank, msg: Message, reply: Outbox },
    /// The connection ended; its waiting requests are forgotten.
    Closed { conn: u64 },
}

/// A request waiting for the sync rounds of its keys.
struct Pending {
    reply: Outbox,
    request_id: u64,
    pull_back: bool,
    keys: Vec<u64>,
    values: Vec<Option<Chunk>>,
    remaining: usize,
    failed: Option<String>,
}

/// All of a server's state.
pub(super) struct Core {
    me: NodeId,
    num_workers: usize,
    sync: bool,
    keys: HashMap<u64, Entry>,
    updater: Option<Updater>,
    pending: HashMap<ReqId, Pending>,
}

type Outcome = Result<Option<Message>, String>;

impl Core {
    pub(super) fn new(me: NodeId, num_workers: u32) -> Core {
        let num_workers = usize::try_from(num_workers).unwrap_or(usize::MAX);
        Core { me, num_workers, sync: true, keys: HashMap::new(), updater: None, pending: HashMap::new() }
    }

    /// Handles events until every sender is gone.
    pub(super) fn run(mut self, mut events: mpsc::UnboundedReceiver<Event>) {
        while let Some(ev) = events.blocking_recv() {
            self.on_event(ev);
        }
    }

    fn label(&self, key: u64) -> String {
        self.keys.get(&key).map_or_else(|| describe_key(key), |e| e.name.clone())
    }

    pub(super) fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Closed { conn } => self.pending.retain(|(c, _), _| *c != conn),
            Event::Request { conn, worker, msg, reply } => {
                let id = msg.request_id;
                let outcome = match msg.command {
                    Command::Push | Command::PushPull if msg.flags.contains(Flags::INIT) => self.init(&msg),
                    Command::Push => self.push(conn, worker, &msg, &reply, false),
                    Command::PushPull => self.push(conn, worker, &msg, &reply, true),
                    Command::Pull => self.pull(&msg),
                    Command::ServerCommand => self.command(&msg),
                    other => Err(format!("a server does not accept {other:?}")),
                };
                match outcome {
                    Ok(Some(m)) => self.send(&reply, m.with_request_id(id)),
                    Ok(None) => {}
                    Err(text) => self.send(&reply, Message::error(id, text)),
                }
            }
        }
    }

    fn send(&self, outbox: &Outbox, msg: Message) {
        // A closed outbox means the connection is gone; the worker learns that on its side.
        let _ = outbox.send(msg.with_sender(self.me));
    }

    fn init(&mut self, msg: &Message) -> Outcome {
        let values = push_values(msg)?;
        let names: Vec<String> = if msg.meta.text.is_empty() {
            values.iter().map(|(k, _)| describe_key(*k)).collect()
        } else {
            serde_json::from_str(&msg.meta.text).map_err(|e| format!("init: key names are not a JSON list of strings: {e}"))?
        };
        if names.len() != values.len() {
            return Err(format!("init: {} key names for {} keys", names.len(), values.len()));
        }
        for (i, (key, _)) in values.iter().enumerate() {
            if self.keys.contains_key(key) || values[..i].iter().any(|(k, _)| k == key) {
                return Err(format!(
                    "duplicate init of key {}; a key is initialised once (init or broadcast), use push to change its value",
                    names[i]
                ));
            }
        }
        let mut entries = Vec::with_capacity(values.len());
        for ((key, value), name) in values.into_iter().zip(names) {
            let entry = Entry::from_init(name.clone(), value).map_err(|e| format!("init of key {name}: {e}"))?;
            entries.push((key, entry));
        }
        self.keys.extend(entries);
        Ok(Some(Message::new(Command::Reply)))
    }

    /// Validates every key of a push before anything changes.
    fn checked(&self, msg: &Message) -> Result<Vec<(u64, Checked)>, String> {
        let mut out = Vec::with_capacity(msg.meta.keys.len());
        for (key, value) in push_values(msg)? {
            let entry = self.keys.get(&key).ok_or_else(|| not_initialised(&describe_key(key)))?;
            out.push((key, entry.check(value)?));
        }
        Ok(out)
    }

    fn push(&mut self, conn: u64, worker: Rank, msg: &Message, reply: &Outbox, pull_back: bool) -> Outcome {
        if pull_back && msg.flags.contains(Flags::ROW_SPARSE) {
            return Err("pushpull takes dense values only; push row_sparse values, then row_sparse_pull".into());
        }
        let checked = self.checked(msg)?;
        if !self.sync {
            let mut out = Message::new(Command::Reply);
            for (key, value) in checked {
                let Some(entry) = self.keys.get_mut(&key) else { continue };
                let merged = entry.single(value)?;
                entry.apply(merged, self.updater.as_mut())?;
                if pull_back {
                    push_chunk(&mut out, key, entry.value_chunk());
                }
            }
            return Ok(Some(out));
        }
        let req = (conn, msg.request_id);
        if self.pending.contains_key(&req) {
            return Err(format!("request id {} is already in use on this connection", msg.request_id));
        }
        let keys: Vec<u64> = checked.iter().map(|(k, _)| *k).collect();
        let n = keys.len();
        if n == 0 {
            return Ok(Some(Message::new(Command::Reply)));
        }
        let pending = Pending {
            reply: reply.clone(),
            request_id: msg.request_id,
            pull_back,
            keys,
            values: vec![None; n],
            remaining: n,
            failed: None,
        };
        self.pending.insert(req, pending);
        for (slot, (key, value)) in checked.into_iter().enumerate() {
            self.contribute(key, Contribution { worker, req, slot, value });
        }
        Ok(None)
    }

    /// Adds one worker's push of `key` to the current round, or queues it for the next one.
    fn contribute(&mut self, key: u64, c: Contribution) {
        let Some(entry) = self.keys.get_mut(&key) else { return };
        if entry.round.contributors.contains(&c.worker) {
            entry.round.queued.push_back(c);
            return;
        }
        if let Err(e) = entry.merge(c.worker, c.req, c.slot, c.value) {
            self.key_done(c.req, c.slot, Err(e));
            return;
        }
        let complete = self.keys.get(&key).is_some_and(|e| e.round.contributors.len() >= self.num_workers);
        if complete {
            self.complete_round(key);
        }
    }

    /// Applies the update of a complete round, answers its requests, starts the next round
    /// with the queued pushes (possibly completing it too).
    fn complete_round(&mut self, key: u64) {
        loop {
            let Some(entry) = self.keys.get_mut(&key) else { return };
            let (merged, waiting) = entry.take_round();
            let result = match merged {
                Some(m) => entry.apply(m, self.updater.as_mut()),
                None => Ok(()),
            };
            let wants_value = waiting.iter().any(|(r, _)| self.pending.get(r).is_some_and(|p| p.pull_back));
            let value = (wants_value && result.is_ok()).then(|| entry.value_chunk());
            for (req, slot) in waiting {
                let outcome = match (&result, &value) {
                    (Err(e), _) => Err(e.clone()),
                    (Ok(()), v) => Ok(v.clone()),
                };
                self.key_done(req, slot, outcome);
            }
            // Start the next round with the pushes that waited for it.
            let Some(entry) = self.keys.get_mut(&key) else { return };
            let queued = std::mem::take(&mut entry.round.queued);
            let mut failures = Vec::new();
            for c in queued {
                if entry.round.contributors.contains(&c.worker) {
                    entry.round.queued.push_back(c);
                } else if let Err(e) = entry.merge(c.worker, c.req, c.slot, c.value) {
                    failures.push((c.req, c.slot, e));
                }
            }
            let again = entry.round.contributors.len() >= self.num_workers;
            for (req, slot, e) in failures {
                self.key_done(req, slot, Err(e));
            }
            if !again {
                return;
            }
        }
    }

    /// One key of a waiting request is done; answers the request when all of its keys are.
    fn key_done(&mut self, req: ReqId, slot: usize, outcome: Result<Option<Chunk>, String>) {
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
            Some(e) => Message::error(p.request_id, e),
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
        self.send(&p.reply, msg);
    }

    fn pull(&mut self, msg: &Message) -> Outcome {
        let rows = msg.flags.contains(Flags::ROW_SPARSE);
        if rows && msg.chunks.len() != msg.meta.keys.len() {
            return Err(format!("a row_sparse pull of {} keys needs one row-id chunk per key", msg.meta.keys.len()));
        }
        let mut out = Message::new(Command::Reply);
        for (i, &key) in msg.meta.keys.iter().enumerate() {
            let label = self.label(key);
            let entry = self.keys.get_mut(&key).ok_or_else(|| not_initialised(&label))?;
            if rows {
                let [ids, data] = entry.rows_chunks(&msg.chunks[i])?;
                out.meta.keys.push(key);
                out.meta.lens.push(len_u64(&ids) + len_u64(&data));
                out.chunks.extend([ids, data]);
            } else {
                let want = msg.meta.lens.get(i).copied().unwrap_or(0);
                if want != entry.byte_len() {
                    return Err(format!("pull of key {label}: the key holds {} bytes here, the request expects {want}", entry.byte_len()));
                }
                push_chunk(&mut out, key, entry.value_chunk());
            }
        }
        Ok(Some(out))
    }

    fn command(&mut self, msg: &Message) -> Outcome {
        let body: Bytes = msg.chunks.first().map(|c| c.data.clone()).unwrap_or_default();
        let text = || std::str::from_utf8(&body).map_err(|_| "the command body is not UTF-8".to_owned());
        let reply = Message::new(Command::Reply);
        match ServerCmd::from_id(msg.meta.head) {
            Some(ServerCmd::SetOptimizer) => {
                let opt = Optimizer::from_json(text()?).map_err(|e| format!("set_optimizer: {e}"))?;
                // The same optimizer again (every worker sends it) keeps the states.
                if self.updater.as_ref().is_some_and(|u| *u.optimizer() == opt) {
                    return Ok(Some(reply));
                }
                self.updater = Some(Updater::try_new(opt).map_err(|e| format!("set_optimizer: {e}"))?);
                Ok(Some(reply))
            }
            Some(ServerCmd::SyncMode) => {
                self.sync = match text()? {
                    "sync" => true,
                    "async" => false,
                    other => return Err(format!("unknown sync mode {other:?}; expected sync or async")),
                };
                Ok(Some(reply))
            }
            Some(ServerCmd::GetOptimizerStates) => {
                let u = self.updater.as_ref().ok_or("no optimizer is installed on this server; call set_optimizer first")?;
                let mut reply = reply;
                reply.chunks.push(Chunk::bytes(u.save_states()));
                Ok(Some(reply))
            }
            Some(ServerCmd::SetOptimizerStates) => {
                let u = self.updater.as_mut().ok_or("no optimizer is installed on this server; call set_optimizer first")?;
                u.load_states(&body).map_err(|e| format!("load_optimizer_states: {e}"))?;
                Ok(Some(reply))
            }
            None => Err(format!("unknown server command id {}", msg.meta.head)),
        }
    }
}

fn len_u64(c: &Chunk) -> u64 {
    u64::try_from(c.data.len()).unwrap_or(u64::MAX)
}

fn push_chunk(out: &mut Message, key: u64, chunk: Chunk) {
    out.meta.keys.push(key);
    out.meta.lens.push(len_u64(&chunk));
    out.chunks.push(chunk);
}

fn not_initialised(label: &str) -> String {
    format!("key {label} has not been initialised on this server; call init({label}, value) on every worker first")
}

/// A ps key for messages: an int key as the user wrote it, a str key by its hash.
pub(super) fn describe_key(key: u64) -> String {
    match u32::try_from(key) {
        Ok(k) => i32::from_ne_bytes(k.to_ne_bytes()).to_string(),
        Err(_) => format!("#{key:016x}"),
    }
}

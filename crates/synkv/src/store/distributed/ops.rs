//! The dist store's data operations as asynchronous engine operations.
//!
//! An operation declares its vars (push: reads the values, writes the keys' vars; pull: reads
//! the keys' vars, writes the outputs; pushpull: both). A push (or a pushpull into other
//! arrays than its inputs) lends a single value's memory to the connection's writer
//! (`Engine::push_async_lending`: no copy; the value is read again by nobody but the writer,
//! and is free once its bytes are written out), or, when it sums, casts or quantizes, or
//! with replicas, releases the values as soon as it has copied them
//! (`Engine::push_async_consuming`); either way waiting to overwrite a pushed array never
//! waits for the servers. On an engine thread it builds the messages (`build.rs`:
//! summed, cut into parts, packed by server within the message budget), hands them to the
//! worker's tokio runtime and returns. The engine operation completes when every server has
//! replied — pulled values are written into the outputs first (`reply.rs`), and every part a
//! server accepted counts one more round — or fails with the error (a lost node, a server's
//! refusal as the store's own typed error where there is one), which the next wait on an
//! output reports. In a sync store a pull right after this worker's push of its keys is
//! usually answered from the values that push asked back, with no message (`held.rs`). No deadline: a sync push waits for slow workers as long as every node is
//! alive.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use rustc_hash::FxHashSet;
use smallvec::SmallVec;

use super::build::{build_with, Budget, Lease};
use super::held;
use super::keys::KeyInfo;
use super::landing;
use super::reply::{prepare_row_outputs, refusal, write_back};
use super::spans::{self, Sent};
use crate::compression::GradientCompression;
use crate::engine::{Completion, Engine, Priority, ReadLease, Var};
use crate::ps::metrics::METRICS;
use crate::ps::proto::Command;
use crate::ps::{trace, wait_each, Client, Role};
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

impl Kind {
    /// The index of this op in `metrics::WORKER_OPS`.
    fn metric(self) -> usize {
        match self {
            Kind::Push => 0,
            Kind::Pull => 1,
            Kind::PushPull => 2,
            Kind::RowSparsePull => 3,
        }
    }
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
    /// The one part of a big dense key this item moves (see [`push_parts`]); `None`: every part.
    pub(crate) part: Option<usize>,
}

impl Item {
    /// The indices of the key parts this item moves.
    pub(crate) fn parts(&self) -> std::ops::Range<usize> {
        match self.part {
            Some(p) => p..p + 1,
            None => 0..self.info.slices.len(),
        }
    }

    /// The engine vars of the key parts this item moves.
    fn key_vars(&self) -> &[Var] {
        match self.part {
            Some(p) => self.info.vars.get(p..p + 1).unwrap_or(&[]),
            None => &self.info.vars,
        }
    }
}

/// Cuts the push of every big dense key whose parts can travel alone into one item per
/// part, each its own engine operation writing only its part's var: each part is copied and
/// sent as soon as it is ready (the copies of a key's parts run on every engine thread while
/// the first parts are on the wire), and a later push or pull of one part waits only for that
/// part. Kept whole: compressed pushes (one residual pass over the key), pushes of several
/// values or of another dtype (summed or cast once), row_sparse keys, and every operation that
/// writes outputs (pull, pushpull): parts writing one output would wait for each other on its
/// var, one part at a time, where one operation asks for every part at once and writes each
/// answer as it arrives (a pushpull's parts are answered as their rounds complete).
pub(crate) fn push_parts(items: Vec<Item>, compressing: bool) -> Vec<Item> {
    let splits = |it: &Item| {
        let info = &it.info;
        info.is_big()
            && it.part.is_none()
            && info.stype == StorageType::Dense
            && !compressing
            && matches!(it.inputs.as_slice(), [one] if one.dtype() == info.dtype)
    };
    if !items.iter().any(splits) {
        return items;
    }
    let mut out = Vec::with_capacity(items.len());
    for it in items {
        if !splits(&it) {
            out.push(it);
            continue;
        }
        for p in 0..it.info.slices.len() {
            out.push(Item { info: Arc::clone(&it.info), inputs: it.inputs.clone(), outs: it.outs.clone(), ids: Vec::new(), part: Some(p) });
        }
    }
    out
}

/// What an operation needs from the store.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) client: Client,
    pub(crate) rt: tokio::runtime::Handle,
    pub(crate) budget: Budget,
    /// Whether a push may send a value from the caller's memory (`build::Lease`): not with
    /// replicas, whose client keeps every request until answered (to send it again after a
    /// failover), which would hold the pushed arrays that long.
    pub(crate) lend: bool,
    /// Whether a push may ask for its value back (`held.rs`): a sync store, unless
    /// `SYNKV_PULL_BACK=0`.
    pub(crate) pull_back: bool,
}

/// Splits items into operations: a big (split) key alone, small keys together.
pub(crate) fn batches(items: Vec<Item>) -> Vec<Vec<Item>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut elems = 0usize;
    for it in items {
        if it.info.is_big() || it.part.is_some() {
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
            Kind::Push => writes.extend(it.key_vars().iter().cloned()),
            Kind::PushPull => {
                writes.extend(it.key_vars().iter().cloned());
                writes.extend(it.outs.iter().map(|a| a.var().clone()));
            }
            Kind::Pull | Kind::RowSparsePull => {
                reads.extend(it.key_vars().iter().cloned());
                writes.extend(it.outs.iter().map(|a| a.var().clone()));
            }
        }
    }
    let (name, op) = match kind {
        Kind::Push => ("dist push", "push"),
        Kind::Pull => ("dist pull", "pull"),
        Kind::PushPull => ("dist pushpull", "pushpull"),
        Kind::RowSparsePull => ("dist row_sparse_pull", "row_sparse_pull"),
    };
    let ctx = ctx.clone();
    let lending = ctx.lend && compression.is_none() && lends(kind, &items);
    let body = move |done: Completion, lease: Option<ReadLease>| {
        if kind == Kind::RowSparsePull {
            items.iter().for_each(prepare_row_outputs);
        }
        // Held values of the keys' last pushes (`held.rs`): a push makes them stale, a pull
        // may be answered from them without a message.
        let back = held::wants_back(kind, &items, ctx.pull_back, compression.is_some(), |s| ctx.client.shares_memory(s));
        match kind {
            Kind::Push | Kind::PushPull => held::forget(&items),
            Kind::Pull => {
                held::note_pull(&items);
                let started = std::time::Instant::now();
                if let Some(served) = held::serve(&items) {
                    let metrics = &METRICS.worker;
                    metrics.latency[kind.metric()].observe(started.elapsed());
                    let rec = trace::recorder(Role::Worker);
                    if rec.enabled() {
                        spans::held(rec, &items, started, served.is_ok());
                    }
                    return match served {
                        Ok(()) => {
                            metrics.pulls_held.add(1);
                            done.done()
                        }
                        Err(e) => {
                            metrics.failures.add(1);
                            done.fail(Box::new(crate::Error::from(e)))
                        }
                    };
                }
            }
            Kind::RowSparsePull => {}
        }
        let rec = trace::recorder(Role::Worker);
        let traced = rec.enabled();
        let building = traced.then(std::time::Instant::now);
        // With a lease, a single value's bytes go to the writer as they are; the lease (and
        // the arrays' data locks) then live as long as the messages, until written out.
        let lease: Option<Lease> = lease.map(|l| Arc::new(l) as Lease);
        let built = build_with(kind, &back, &items, priority, compression.as_ref(), ctx.budget, lease.as_ref());
        drop(lease);
        let (msgs, places) = match built {
            Ok(built) => built,
            Err(e) => return done.fail(Box::new(e)),
        };
        // The messages of a push that ask for their values back (`held.rs`).
        let backs: Vec<bool> = msgs.iter().map(|(_, m)| kind == Kind::Push && m.command == Command::PushPull).collect();
        // Answers read from the socket straight into the outputs, where they can be.
        let mut landings = landing::landings(kind, &items, &msgs, &places);
        if let Some(started) = building {
            spans::partitioned(rec, kind, &items, started);
        }
        let Ctx { client, rt, .. } = ctx;
        rt.spawn(async move {
            let metrics = &METRICS.worker;
            let started = std::time::Instant::now();
            metrics.in_flight.add(1);
            if matches!(kind, Kind::Push | Kind::PushPull) {
                metrics.push_bytes.add(msgs.iter().flat_map(|(_, m)| &m.chunks).map(|c| c.data.len() as u64).sum());
            }
            let mut first_error = None;
            let mut waiters = Vec::with_capacity(msgs.len());
            let mut sent = Vec::with_capacity(msgs.len());
            // Per waiter, when traced: when its message left and its keys' bytes.
            let mut traced_sent = Vec::new();
            for (m, (server, msg)) in msgs.into_iter().enumerate() {
                let lens = if traced { msg.meta.lens.clone() } else { Vec::new() };
                match client.start_landing(server, msg, landings.get(m).cloned().flatten()) {
                    Ok(w) => {
                        waiters.push(w);
                        sent.push(m);
                        if traced {
                            traced_sent.push(Sent { at: std::time::Instant::now(), lens });
                        }
                    }
                    Err(e) => {
                        first_error.get_or_insert(crate::Error::from(e));
                    }
                }
            }
            // Each answer is used as soon as it arrives (its part of the outputs written, its
            // round counted) and dropped: answers never wait behind one not yet in.
            wait_each(waiters, |j, reply| {
                let place = &places[sent[j]];
                // The rounds the parts were pushed in, for their spans.
                let mut pushed: SmallVec<[u64; 8]> = SmallVec::new();
                let outcome = reply.map_err(|e| refusal(e, op, items.iter().map(|it| (it.info.ps, it.info.key.clone())))).and_then(
                    |(reply, _admission)| {
                        // The key lengths add up to the chunks' bytes (checked on decoding), also
                        // for an answer that landed, whose chunks carry no bytes.
                        metrics.pull_bytes.add(reply.meta.lens.iter().sum());
                        if matches!(kind, Kind::Push | Kind::PushPull) {
                            // The server counted these parts: their next push is the next round.
                            for &(i, part, _) in place {
                                let round = items[i].info.rounds[part].fetch_add(1, Ordering::AcqRel);
                                if traced {
                                    pushed.push(round);
                                }
                            }
                        }
                        if backs[sent[j]] {
                            held::keep_answers(&items, place, &reply).map_err(crate::Error::from)?;
                        }
                        let landing = landings.get(sent[j]).and_then(Option::as_deref);
                        write_back(kind, &items, std::slice::from_ref(place), std::slice::from_ref(&reply), &[landing])
                            .map_err(crate::Error::from)
                    },
                );
                if let Some(s) = traced_sent.get(j) {
                    spans::answered(rec, kind, &items, place, s, &pushed, outcome.is_ok());
                }
                if let Err(e) = outcome {
                    first_error.get_or_insert(e);
                }
            })
            .await;
            // The outputs' loans end here, before the operation completes.
            landings.clear();
            metrics.in_flight.add(-1);
            metrics.latency[kind.metric()].observe(started.elapsed());
            match first_error {
                None => {
                    if matches!(kind, Kind::Push | Kind::PushPull) {
                        metrics.stepped();
                    }
                    done.done()
                }
                Some(e) => {
                    metrics.failures.add(1);
                    if let crate::Error::Dist(e) = &e {
                        trace::dump_error(Role::Worker, e);
                    }
                    done.fail(Box::new(e))
                }
            }
        });
    };
    let engine = Engine::global();
    match kind {
        // The pushed arrays are lent to the writer: free again once their bytes are written
        // out (into a shared-memory slot or onto the socket), long before the servers answer.
        Kind::Push | Kind::PushPull if lending => {
            engine.push_async_lending(name, &reads, &writes, priority, move |done, lease| body(done, Some(lease)))
        }
        // The body copies (or quantizes) the pushed arrays before it returns: they are free
        // again then.
        Kind::Push | Kind::PushPull => engine.push_async_consuming(name, &reads, &writes, priority, move |done| body(done, None)),
        Kind::Pull | Kind::RowSparsePull => engine.push_async(name, &reads, &writes, priority, move |done| body(done, None)),
    }
}

/// Whether an operation may send its values from the callers' memory: a push, or a pushpull
/// none of whose outputs is one of its inputs. Writing an answer into an output takes that
/// array's data lock, which a lent value holds until its bytes are written out — for a key
/// in several parts, until its last part has left — so an answer could wait for a later
/// message (and hold a runtime thread meanwhile); such a pushpull copies its values instead.
fn lends(kind: Kind, items: &[Item]) -> bool {
    match kind {
        Kind::Push => true,
        Kind::PushPull => {
            // A batch may hold 10^5 keys: a set, not a comparison of every pair.
            let inputs: FxHashSet<usize> = items.iter().flat_map(|it| &it.inputs).map(NDArray::identity).collect();
            !items.iter().flat_map(|it| &it.outs).any(|o| inputs.contains(&o.identity()))
        }
        Kind::Pull | Kind::RowSparsePull => false,
    }
}

/// The bytes of a command body.
pub(crate) fn body(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::slicer;
    use crate::store::Key;
    use crate::{DType, Shape};

    fn item(k: i32, input: &NDArray, out: &NDArray) -> Item {
        let info = KeyInfo::for_test(
            Key::Int(k),
            Shape::from(vec![4]),
            DType::F32,
            StorageType::Dense,
            slicer::slices(slicer::int_key(k), 4, 1, 1, 100),
        );
        Item {
            info: Arc::new(info),
            inputs: smallvec::smallvec![input.clone()],
            outs: smallvec::smallvec![out.clone()],
            ids: Vec::new(),
            part: None,
        }
    }

    #[test]
    fn a_pushpull_lends_its_values_only_when_no_output_is_one_of_its_inputs() {
        let (a, b, c) = (NDArray::ones([4]), NDArray::ones([4]), NDArray::ones([4]));
        assert!(lends(Kind::Push, &[item(1, &a, &a)]));
        assert!(lends(Kind::PushPull, &[item(1, &a, &b), item(2, &c, &NDArray::ones([4]))]));
        assert!(!lends(Kind::PushPull, &[item(1, &a, &a)]), "in place");
        assert!(!lends(Kind::PushPull, &[item(1, &a, &b), item(2, &c, &a)]), "one key's output is another key's input");
        assert!(!lends(Kind::Pull, &[item(1, &a, &b)]));
    }
}

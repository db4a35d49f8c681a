//! Rounds completed together, updated on several threads ("sharded by key").
//!
//! One request often completes many rounds at once: the last worker's push of a model's
//! hundreds of keys, or a worker finishing. Their sums and optimizer steps are independent,
//! so the partition collects them in a batch while it handles the request, then runs the
//! updates on rayon's pool — each entry on one thread, so an entry's updates still never run
//! concurrently (spec K8.12) — and settles them (replies, queued pushes) in order on its own
//! thread. The optimizer's per-key counts and learning rates advance in the batch's order
//! before the updates run ([`Updater::lend`]), exactly as one after another would advance
//! them, so results are identical to the sequential path's (`tests.rs` compares them).
//!
//! Large arrays are already split across threads by the kernels; a batch matters for many
//! small and medium keys, each too short to split. Row_sparse rounds and failed rounds run one
//! by one as before, and so does a batch too small to be worth waking the pool. With a backup
//! copy (`SYNKV_SERVER_REPLICAS=1`) each job keeps what its round changed (the sum an update
//! was applied to, or an assign's new value), and the backup gets those changes in the
//! batch's order before the rounds settle — the messages the one-by-one path sends, sent after
//! the updates instead of beside them. The batch's rounds are traced (sum and update spans) as
//! the one-by-one rounds are.

use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use super::replica::RoundChange;
use super::{spans, Finished, Partition, RoundResult, SEND_AT_ONCE};
use crate::optimizer::{LentUpdate, Optimizer, Updater};
use crate::ps::proto::Chunk;
use crate::ps::server::entry::{Applied, Entry, Upd};
use crate::ps::server::error::ServerError;
use crate::ps::transport::share::BroadcastHub;
use crate::ps::transport::shm::Broadcast;

/// A batch whose large entries hold fewer bytes in all runs on the partition's thread:
/// waking the pool costs more than it saves.
const PARALLEL_MIN_BYTES: u64 = 256 << 10;
/// Entries smaller than this update on the partition's thread even in a parallel batch:
/// taking one out of the partition and back costs more than its update (4000 keys of 256
/// bytes with SGD ran 10–20 % slower in parallel).
const JOB_MIN_BYTES: u64 = 16 << 10;

/// One round of a batch. A large entry is taken out of the partition (`entry`) while its
/// update runs on the pool; a small one updates in place on the partition's thread.
struct Job {
    f: Finished,
    entry: Option<Entry>,
    lent: Option<Result<LentUpdate, ServerError>>,
    result: RoundResult,
    /// With a backup copy: the sum the update was applied to, for the backup.
    sum: Option<Chunk>,
    /// When the update started, when its sum was complete (an update), when it ended.
    times: Option<(Instant, Option<Instant>, Instant)>,
}

impl Job {
    fn run(&mut self, entry: &mut Entry, opt: Option<&Optimizer>, shared: Option<&Arc<Broadcast>>, (traced, replicating): (bool, bool)) {
        let started = Instant::now();
        let key = self.f.key;
        let upd = match (&mut self.lent, opt) {
            (Some(Err(e)), _) => {
                self.result = Err(e.clone().at(key));
                return;
            }
            (Some(Ok(lent)), Some(opt)) => Some(Upd::Lent(lent, opt)),
            _ => None,
        };
        let held = std::mem::take(&mut self.f.held);
        let (mut summed, mut sum) = (None, None);
        let mut on_sum = |chunk: Chunk| {
            summed = Some(Instant::now());
            if replicating {
                sum = Some(chunk);
            }
        };
        let on_sum: Option<&mut dyn FnMut(Chunk)> = if traced || replicating { Some(&mut on_sum) } else { None };
        // An assign's change is its new value, which `settle` sends to the backup (as the
        // one-by-one path does); an update's is its sum, sent before the round settles.
        self.result = entry
            .finish_dense(held, self.f.accumulated, upd, on_sum, shared)
            .map(|applied| match applied {
                Applied::Assign if replicating => Some(RoundChange::Assign(entry.value_chunk())),
                _ => None,
            })
            .map_err(|e| e.at(key));
        self.sum = sum;
        let end = Instant::now();
        crate::ps::metrics::METRICS.server.update.observe(end - started);
        self.times = Some((started, summed, end));
    }

    /// Runs the update of a job whose entry was taken out.
    fn run_taken(&mut self, opt: Option<&Optimizer>, shared: Option<&Arc<Broadcast>>, flags: (bool, bool)) {
        if let Some(mut entry) = self.entry.take() {
            self.run(&mut entry, opt, shared, flags);
            self.entry = Some(entry);
        }
    }
}

impl Partition {
    /// Opens a batch: dense rounds completed until [`Partition::run_batch`] wait in it.
    pub(super) fn open_batch(&mut self) {
        self.batch.get_or_insert_with(Vec::new);
    }

    /// Whether a taken round may wait in the batch (see the module docs).
    pub(super) fn batchable(&self, f: &Finished) -> bool {
        f.failed.is_none() && f.rows.is_empty() && self.keys.get(&f.key).is_some_and(|e| !e.is_rows())
    }

    /// Closes the batch: runs its updates (the large entries' on several threads when it is
    /// worth it), then settles each round in the batch's order.
    pub(super) fn run_batch(&mut self) {
        let Some(batch) = self.batch.take() else { return };
        // Entries' sizes, 0 for those too small to go to the pool (most pushes complete one
        // round: nothing to size then).
        let large: Vec<u64> = if batch.len() < 2 {
            Vec::new()
        } else {
            let size = |f: &Finished| self.keys.get(&f.key).map_or(0, Entry::byte_len);
            batch.iter().map(|f| Some(size(f)).filter(|b| *b >= JOB_MIN_BYTES).unwrap_or(0)).collect()
        };
        let count = large.iter().filter(|b| **b > 0).count();
        if count < 2 || large.iter().sum::<u64>() < PARALLEL_MIN_BYTES || self.settings.threads.count() < 2 {
            for mut f in batch {
                let result = self.run_round(&mut f);
                self.settle(f, result);
            }
            return;
        }
        crate::ps::metrics::METRICS.server.parallel_rounds.add(u64::try_from(count).unwrap_or(u64::MAX));
        // The updater lends every round its state in the batch's order; the large entries
        // leave the map while their updates run.
        let mut jobs = Vec::with_capacity(batch.len());
        for (f, large) in batch.into_iter().zip(large) {
            let lent = match (self.updater.as_mut(), self.keys.get(&f.key)) {
                (Some(u), Some(e)) => Some(e.lend(u)),
                _ => None,
            };
            let entry = if large > 0 { self.keys.remove(&f.key) } else { None };
            jobs.push(Job { f, entry, lent, result: Ok(None), sum: None, times: None });
        }
        let opt = self.updater.as_ref().map(Updater::optimizer);
        let shared = self.settings.shared.as_deref().and_then(BroadcastHub::existing);
        let (rec, updating) = (spans::recorder(), opt.is_some());
        let flags = (rec.is_some(), self.repl.active());
        let threads = &self.settings.threads;
        let keys = &mut self.keys;
        threads.install(|| jobs.par_iter_mut().filter(|j| j.entry.is_some()).for_each(|j| j.run_taken(opt, shared, flags)));
        for job in jobs.iter_mut().filter(|j| j.entry.is_none()) {
            if let Some(entry) = keys.get_mut(&job.f.key) {
                job.run(entry, opt, shared, flags);
            }
        }
        // Every state and entry is back before any round settles (settling may start the
        // next round of a key, which updates it again).
        let mut settled = Vec::with_capacity(jobs.len());
        for job in jobs {
            if let Some(entry) = job.entry {
                self.keys.insert(job.f.key, entry);
            }
            if let (Some(rec), Some(times), Some(entry)) = (rec, job.times, self.keys.get(&job.f.key)) {
                spans::round(rec, (&entry.label, job.f.key.1), job.f.round_id, entry.byte_len(), times, updating, job.result.is_ok());
            }
            if let (Some(u), Some(Ok(lent))) = (self.updater.as_mut(), job.lent) {
                u.give_back(lent);
            }
            settled.push((job.f, job.result, job.sum));
        }
        for (f, result, sum) in settled {
            // The backup gets an update's sum before the round settles, with the round id the
            // one-by-one path gives it (the entry's, taken rounds already counted) — also when
            // the update then failed, as the one-by-one path sends the sum before updating.
            if let (Some(sum), Some(entry)) = (sum, self.keys.get(&f.key)) {
                let big = sum.data.len() >= SEND_AT_ONCE;
                self.repl.add_round(f.key, entry.round.id, RoundChange::Update(sum), self.settings.page_bytes);
                if big {
                    self.repl.flush();
                }
            }
            self.settle(f, result);
        }
    }
}

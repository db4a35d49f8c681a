//! Checkpoints from the workers' side: the collective that takes one, the periodic schedule,
//! and what a restarted job is told.
//!
//! **Taking one** ([`DistStore::checkpoint`], every worker calls it at the same point of
//! training, like a barrier): each worker waits for its own operations — so every sync round it
//! took part in is complete — then all meet at a barrier: nothing is partly summed on any
//! server, which is the one round boundary across all servers. Rank 0 then has every server
//! write its shard (`ServerCmd::Checkpoint`) into `DIR/ckpt-<id>/`, and publishes
//! `DIR/MANIFEST.json` naming them (`ps::checkpoint`); a second barrier lets everyone go on.
//!
//! **Periodically** (`SYNKV_CHECKPOINT_DIR` + `SYNKV_CHECKPOINT_INTERVAL`): every `N` rounds —
//! `push`/`pushpull` calls, which every worker of a sync job makes alike — or about every `N`
//! seconds, at a round rank 0 announces a few rounds ahead through the scheduler. Both assume
//! what sync training does anyway: the workers make the same calls, within a few rounds of one
//! another.
//!
//! **Restarting**: when `SYNKV_CHECKPOINT_DIR` holds a checkpoint, the servers start from it
//! (`ps::server`), `init` of the keys it holds keeps their values, and every worker logs once
//! which round it resumes from and that the rounds after it were lost;
//! [`DistStore::resumed_round`] says it to the program.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{block, command_all, DistStore};
use crate::engine::Engine;
use crate::ps::checkpoint::{self, checkpoint_dir_name, Manifest, ShardFile};
use crate::ps::{CheckpointInterval, Config, ServerCmd};

/// How many rounds ahead rank 0 announces a time-based checkpoint.
pub(super) const LEAD_ROUNDS: u64 = 8;

/// A checkpoint that was written.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointInfo {
    /// Its id (increasing within a directory).
    pub id: u64,
    /// Rank 0's `push` calls before it (training steps).
    pub round: u64,
}

/// The periodic schedule of a store.
#[derive(Debug)]
pub(super) struct Schedule {
    pub(super) interval: Option<CheckpointInterval>,
    /// When the last checkpoint was taken (or the store created).
    pub(super) last: parking_lot::Mutex<Instant>,
}

impl Schedule {
    pub(super) fn new(config: &Config) -> Schedule {
        Schedule { interval: config.checkpoint_interval, last: parking_lot::Mutex::new(Instant::now()) }
    }
}

/// The round a restarted job resumes from (the manifest in `SYNKV_CHECKPOINT_DIR`), logged
/// once per worker.
pub(super) fn resumed(config: &Config) -> crate::Result<Option<u64>> {
    let Some(dir) = &config.checkpoint_dir else { return Ok(None) };
    let manifest = checkpoint::read_manifest(dir).map_err(|e| unsupported_ckpt(e.to_string()))?;
    Ok(manifest.map(|m| {
        tracing::warn!(
            "resuming from checkpoint {} in {} (round {}): the servers hold its values and optimizer states; the rounds pushed after it were lost and must be done again",
            m.id,
            dir.display(),
            m.round
        );
        m.round
    }))
}

fn unsupported_ckpt(reason: String) -> crate::Error {
    crate::store::Error::Unsupported { op: "checkpoint", store_type: "dist".into(), reason }.into()
}

impl DistStore {
    /// Takes a checkpoint into `dir` (collective: see the module docs). Every worker returns
    /// the same [`CheckpointInfo`].
    pub(crate) fn checkpoint(&self, dir: &Path) -> crate::Result<CheckpointInfo> {
        self.wait_own_ops();
        self.barrier()?;
        let taken = if self.rank == 0 { self.write_checkpoint(dir) } else { Ok(()) };
        // Everyone meets again, even when rank 0 failed, so nobody is left at the barrier.
        let met = self.barrier();
        taken?;
        met?;
        *self.schedule.last.lock() = Instant::now();
        let manifest = checkpoint::read_manifest(dir).map_err(|e| unsupported_ckpt(e.to_string()))?;
        let manifest = manifest.ok_or_else(|| unsupported_ckpt(format!("no manifest in {} after the checkpoint", dir.display())))?;
        Ok(CheckpointInfo { id: manifest.id, round: manifest.round })
    }

    /// Rank 0's part: every server writes its shard, then the manifest names them.
    fn write_checkpoint(&self, dir: &Path) -> crate::Result<()> {
        let fail = |e: String| unsupported_ckpt(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
        let previous = checkpoint::read_manifest(dir).map_err(|e| fail(e.to_string()))?;
        let id = previous.map_or(1, |m| m.id + 1);
        let sub = dir.join(checkpoint_dir_name(id));
        let body = serde_json::json!({ "dir": sub, "id": id }).to_string();
        let started = Instant::now();
        let replies = block(&self.handle, command_all(&self.ctx.client, ServerCmd::Checkpoint, body.into()))?;
        let mut shards = Vec::with_capacity(replies.len());
        for r in &replies {
            let body = r.chunks.first().map(|c| c.data.clone()).unwrap_or_default();
            let shard: ShardFile = serde_json::from_slice(&body).map_err(|e| fail(format!("a server's answer: {e}")))?;
            shards.push(shard);
        }
        let round = self.push_calls.load(Ordering::Acquire);
        let manifest = Manifest::new(id, round, self.num_servers, self.num_workers, self.sync, shards);
        checkpoint::publish(dir, &manifest).map_err(|e| fail(e.to_string()))?;
        let bytes: u64 = manifest.shards.iter().map(|s| s.bytes).sum();
        tracing::info!(
            "checkpoint {id} (round {round}) written to {}: {bytes} bytes in {:.2} s",
            dir.display(),
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Waits until this store's scheduled operations are done (their errors were reported to
    /// the waits of their arrays already).
    pub(super) fn wait_own_ops(&self) {
        let vars: Vec<_> = self.registry.lock().all().flat_map(|k| k.vars.iter().cloned()).collect();
        for v in vars {
            let _ = Engine::global().wait_to_write(&v);
        }
    }

    /// Counts a `push`/`pushpull` call and takes the periodic checkpoint it is due for.
    pub(super) fn after_push(&self) -> crate::Result<()> {
        let calls = self.push_calls.fetch_add(1, Ordering::AcqRel) + 1;
        let (Some(interval), Some(dir)) = (self.schedule.interval, self.checkpoint_dir.as_deref()) else { return Ok(()) };
        let due = match interval {
            CheckpointInterval::Rounds(n) => calls.is_multiple_of(n),
            CheckpointInterval::Seconds(every) => {
                let worker = self.worker.lock();
                let Some(w) = worker.as_ref() else { return Ok(()) };
                if self.rank == 0
                    && w.cluster().checkpoint_planned().is_none_or(|at| at < calls)
                    && self.schedule.last.lock().elapsed() >= every
                {
                    // Announce it a few rounds ahead, so every worker meets it at the same round.
                    block(&self.handle, w.cluster().plan_checkpoint(calls + LEAD_ROUNDS))?;
                }
                w.cluster().checkpoint_planned() == Some(calls)
            }
        };
        if due {
            self.checkpoint(dir)?;
        }
        Ok(())
    }
}

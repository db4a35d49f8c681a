//! The distributed store, worker side: `dist_sync`, `dist_async`, `dist_device_sync`.
//!
//! [`DistStore::create`] reads the `DMLC_*`/`SYNKV_*` environment (`ps::Config`), starts
//! the process's tokio runtime (two threads, owned by the store), joins the cluster and
//! connects to every server (`ps::Worker`). Rank 0 then tells every server the mode (sync
//! or async) and every worker waits at a barrier, so the servers are configured before any
//! worker goes on.
//!
//! Without `DMLC_PS_ROOT_URI`, a process started by torchrun, Slurm or MPI finds its rank
//! and the cluster in the orchestrator's variables (`ps::orchestrator`); rank 0 then hosts
//! the scheduler and some processes host a server, started before the worker joins and kept
//! running after it closes, until the job ends (`hosted.rs`).
//!
//! - `init` registers the keys on every worker (each worker validates its own calls); rank 0
//!   alone sends the values (flag `INIT`; a key a server already holds is refused with an
//!   error naming it); then every worker waits at a barrier, so any worker can pull at once
//!   (spec K2.4).
//! - `push`, `pull`, `pushpull`, `row_sparse_pull` are asynchronous engine operations
//!   (`ops.rs`): per-device values are summed on the worker, small keys are packed into one
//!   message per server, big keys are split over every server. In a sync store a pull
//!   right after this worker's push is answered from the values the push asked back
//!   (`held.rs`, docs/dist.md "Pull after push").
//! - `set_gradient_compression` (`set_compression`) makes later pushes of dense f32 keys travel
//!   as packed words quantized with a residual per key (`ops.rs`); see docs/dist.md.
//! - `set_optimizer` sends the optimizer's JSON to every server from every worker; identical
//!   configurations keep the servers' states, a different one replaces them.
//! - `barrier` is a worker barrier; `close` (or dropping the store) waits for this process's
//!   operations, then tells the scheduler this worker is done and waits until every worker
//!   is, after which servers and scheduler exit; a process that hosts them waits for that
//!   too and reports their error.
//!
//! Failures (a node dies, the scheduler goes away, a request outlives `SYNKV_TIMEOUT_MS`) fail
//! pending and later operations with a `ps::Error` naming the node; blocking calls return
//! it, asynchronous ones report it at the next wait.

mod build;
mod checkpoint;
mod held;
mod hosted;
mod init;
mod keys;
mod landing;
mod ops;
mod reply;
mod spans;
mod states;

pub use checkpoint::CheckpointInfo;
pub use states::ServerStats;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::runtime::{Handle, Runtime};
use tokio_util::sync::CancellationToken;

use self::build::Budget;
use self::hosted::Hosted;
use self::keys::{check_array, Layout, Registry};
use self::ops::{Ctx, Item, Kind};
use super::kvstore::PullReport;
use super::{Error, Key, StoreType};
use crate::compression::GradientCompression;
use crate::engine::{Engine, Priority};
use crate::optimizer::Optimizer;
use crate::ps::proto::Message;
use crate::ps::{Client, Config, Error as DistError, Role, ServerCmd, TcpTransport, Worker};
use crate::{NDArray, StorageType};

/// One distributed store per process (MXNet #14434, spec K8.16).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The worker side of a distributed store.
pub(crate) struct DistStore {
    name: String,
    rt: Option<Runtime>,
    handle: Handle,
    worker: Mutex<Option<Worker>>,
    ctx: Ctx,
    rank: u32,
    num_workers: u32,
    num_servers: u32,
    layout: Layout,
    registry: Mutex<Registry>,
    optimizer: Mutex<Option<Optimizer>>,
    compression: Mutex<Option<GradientCompression>>,
    /// Longest text field of a frame (bounds the key names of an init message).
    max_text: usize,
    /// Sync mode (not `dist_async`).
    sync: bool,
    /// `push`/`pushpull` calls so far (rounds), counted from the round the job resumed from.
    push_calls: std::sync::atomic::AtomicU64,
    /// `SYNKV_CHECKPOINT_DIR`.
    checkpoint_dir: Option<std::path::PathBuf>,
    /// The periodic checkpoints.
    schedule: checkpoint::Schedule,
    /// The round the job resumed from, when `SYNKV_CHECKPOINT_DIR` held a checkpoint.
    resumed: Option<u64>,
    /// This process took the rank of a worker that died (`SYNKV_WORKER_RESTARTS=1`): its
    /// `init` adopts the keys the servers hold, without a barrier (see `init.rs`).
    rejoined: bool,
    /// The scheduler and server this process hosts (an orchestrator started it).
    hosted: Mutex<Option<Hosted>>,
}

/// Runs `fut` to completion on the store's runtime from a plain thread (from inside another
/// runtime, on a helper thread, since a runtime cannot block inside another).
fn block<F>(handle: &Handle, fut: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    if Handle::try_current().is_err() {
        return handle.block_on(fut);
    }
    std::thread::scope(|s| match s.spawn(|| handle.block_on(fut)).join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// Sends a server command to every server and waits for every reply.
async fn command_all(client: &Client, cmd: ServerCmd, body: bytes::Bytes) -> Result<Vec<Message>, DistError> {
    let msgs = (0..client.num_servers()).map(|s| (s, Message::server_command(cmd.id(), body.clone()))).collect();
    client.request_all(msgs).await
}

fn unsupported(op: &'static str, store_type: &str, reason: impl Into<String>) -> Error {
    Error::Unsupported { op, store_type: store_type.to_owned(), reason: reason.into() }
}

impl DistStore {
    /// Joins the cluster described by the environment as a worker.
    pub(crate) fn create(kind: StoreType, name: &str) -> crate::Result<DistStore> {
        let config = Config::from_worker_env().map_err(DistError::from)?;
        if config.role != Role::Worker {
            let reason = format!(
                "this process has DMLC_ROLE={}; servers and the scheduler run `synkv server` and `synkv scheduler`, and a worker is any program that creates a dist store",
                config.role
            );
            return Err(unsupported("create", name, reason).into());
        }
        if ACTIVE.swap(true, Ordering::AcqRel) {
            return Err(unsupported(
                "create",
                name,
                "only one distributed store per process is supported (MXNet #14434); close the first one",
            )
            .into());
        }
        let made = Self::connect(kind, name, &config);
        if made.is_err() {
            ACTIVE.store(false, Ordering::Release);
        }
        made
    }

    fn connect(kind: StoreType, name: &str, config: &Config) -> crate::Result<DistStore> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("synkv-dist")
            .enable_all()
            .build()
            .map_err(DistError::from)?;
        let handle = rt.handle().clone();
        let (worker, hosted, resumed) = match Self::join(kind, config, &handle) {
            Ok(joined) => joined,
            Err(e) => {
                // Safe inside another runtime, unlike dropping it.
                rt.shutdown_background();
                return Err(e);
            }
        };
        let client = worker.client();
        let rejoined = worker.rejoined();
        Ok(DistStore {
            name: name.to_owned(),
            rank: worker.rank(),
            num_workers: worker.num_workers(),
            num_servers: worker.num_servers(),
            layout: Layout { servers: worker.num_servers(), bound: config.bigarray_bound, partition_bytes: config.partition_bytes },
            ctx: Ctx {
                client,
                rt: handle.clone(),
                budget: Budget::new(config.partition_bytes, &config.limits),
                lend: config.replicas == 0,
                pull_back: kind != StoreType::DistAsync && config.pull_back,
            },
            max_text: usize::try_from(config.limits.max_string_len).unwrap_or(usize::MAX),
            rt: Some(rt),
            handle,
            worker: Mutex::new(Some(worker)),
            registry: Mutex::new(Registry::default()),
            optimizer: Mutex::new(None),
            compression: Mutex::new(None),
            sync: kind != StoreType::DistAsync,
            push_calls: std::sync::atomic::AtomicU64::new(resumed.unwrap_or(0)),
            checkpoint_dir: config.checkpoint_dir.clone(),
            schedule: checkpoint::Schedule::new(config),
            resumed,
            rejoined,
            hosted: Mutex::new(hosted),
        })
    }

    /// Starts the roles this process hosts, joins as a worker and, at a job's start, configures
    /// the servers' mode (rank 0) and waits at the start-up barrier.
    fn join(kind: StoreType, config: &Config, handle: &Handle) -> crate::Result<(Worker, Option<Hosted>, Option<u64>)> {
        let resumed = checkpoint::resumed(config)?;
        let mut hosted = match &config.placement {
            Some(p) => {
                tracing::info!(
                    "{}: worker rank {} of {}{}{}",
                    p.source,
                    config.task_id.unwrap_or(0),
                    config.num_workers,
                    if p.scheduler { ", hosting the scheduler" } else { "" },
                    if p.server { ", hosting a server" } else { "" }
                );
                Hosted::start(config, p)?
            }
            None => None,
        };
        let transport = TcpTransport::for_config(config);
        let joining = Worker::connect(&transport, config, CancellationToken::new());
        let worker = match hosted.as_mut() {
            None => block(handle, joining)?,
            // A hosted role that cannot join fails the creation at once.
            Some(h) => block(handle, async {
                tokio::select! {
                    w = joining => w,
                    e = h.failure() => Err(e),
                }
            })?,
        };
        if worker.rank() == 0 {
            let servers = worker.cluster().nodes_of(Role::Server);
            if let Some(hint) = config.partition_hint(&config.node_host, servers.iter().map(|n| n.host.as_str())) {
                tracing::warn!("{hint}");
            }
        }
        // A restarted worker joins a running job: the others are past the start-up barrier.
        if !worker.rejoined() {
            if worker.rank() == 0 {
                let mode = if kind == StoreType::DistAsync { "async" } else { "sync" };
                block(handle, command_all(&worker.client(), ServerCmd::SyncMode, ops::body(mode)))?;
            }
            block(handle, worker.barrier())?;
        }
        Ok((worker, hosted, resumed))
    }

    /// The round (rank 0's `push` calls) of the checkpoint the job resumed from, if it did.
    pub(crate) fn resumed_round(&self) -> Option<u64> {
        self.resumed
    }

    pub(crate) fn rank(&self) -> usize {
        usize::try_from(self.rank).unwrap_or(usize::MAX)
    }

    pub(crate) fn num_workers(&self) -> usize {
        usize::try_from(self.num_workers).unwrap_or(usize::MAX)
    }

    pub(crate) fn num_servers(&self) -> usize {
        usize::try_from(self.num_servers).unwrap_or(usize::MAX)
    }

    /// A worker barrier (does not wait for pending pushes and pulls, spec K12.19).
    pub(crate) fn barrier(&self) -> crate::Result<()> {
        let guard = self.worker.lock();
        let worker = guard.as_ref().ok_or_else(|| unsupported("barrier", &self.name, "the store is closed"))?;
        block(&self.handle, worker.barrier()).map_err(Into::into)
    }

    pub(crate) fn push(&self, pairs: Vec<(Key, &NDArray)>, priority: Priority) -> crate::Result<()> {
        let compression = *self.compression.lock();
        let items = self.push_items("push", pairs, compression.is_some())?;
        for batch in ops::batches(ops::push_parts(items, compression.is_some())) {
            ops::schedule(&self.ctx, Kind::Push, batch, priority, compression);
        }
        self.after_push()
    }

    /// Turns on gradient compression: later pushes of dense f32 keys travel as packed words,
    /// quantized with a residual per key (spec K7.10); the servers dequantize. The
    /// configuration travels with each compressed push, so nothing is sent now, workers need
    /// not agree on when they call this, and it may be called after `init` (keys initialised
    /// before keep their split over the servers; see `Registry::register`).
    pub(crate) fn set_compression(&self, gc: GradientCompression) {
        *self.compression.lock() = Some(gc);
    }

    fn push_items(&self, op: &'static str, pairs: Vec<(Key, &NDArray)>, compressing: bool) -> crate::Result<Vec<Item>> {
        let groups = self.registry.lock().group(op, pairs)?;
        let mut items = Vec::with_capacity(groups.len());
        for g in groups {
            if compressing && (g.info.stype != StorageType::Dense || g.info.dtype != crate::DType::F32) {
                return Err(unsupported(
                    op,
                    &self.name,
                    match g.info.stype {
                        StorageType::Dense => format!(
                            "gradient compression applies to dense float32 values only (spec K7.13); key {} holds {} values",
                            g.info.key, g.info.dtype
                        ),
                        _ => format!(
                            "gradient compression applies to dense float32 values only (spec K7.13); key {} is row_sparse",
                            g.info.key
                        ),
                    },
                )
                .into());
            }
            for v in &g.arrays {
                check_array(op, &g.info, v, true)?;
                if g.info.stype == StorageType::Dense && v.storage_type() == StorageType::RowSparse {
                    return Err(Error::UnsupportedStorage {
                        op,
                        key: g.info.key.clone(),
                        stype: StorageType::RowSparse,
                        hint: "the key is dense on the servers; push dense values, or initialise the key with a row_sparse value",
                    }
                    .into());
                }
            }
            items.push(Item {
                info: g.info,
                inputs: g.arrays.into_iter().cloned().collect(),
                outs: SmallVec::new(),
                ids: Vec::new(),
                part: None,
            });
        }
        Ok(items)
    }

    pub(crate) fn pull(&self, pairs: Vec<(Key, &NDArray)>, priority: Priority, ignore_sparse: bool) -> crate::Result<PullReport> {
        if !ignore_sparse {
            return Err(unsupported(
                "pull",
                &self.name,
                "ignore_sparse = false: a dist store pulls into dense outputs only (spec K4.4); use row_sparse_pull for row_sparse outputs",
            )
            .into());
        }
        let groups = self.registry.lock().group("pull", pairs)?;
        let mut report = PullReport::default();
        let mut items = Vec::with_capacity(groups.len());
        for g in groups {
            let mut outs = SmallVec::new();
            for o in &g.arrays {
                check_array("pull", &g.info, o, false)?;
                if o.storage_type() == StorageType::RowSparse {
                    if !report.skipped_sparse.contains(&g.info.key) {
                        report.skipped_sparse.push(g.info.key.clone());
                    }
                } else {
                    outs.push((*o).clone());
                }
            }
            if !outs.is_empty() {
                items.push(Item { info: g.info, inputs: SmallVec::new(), outs, ids: Vec::new(), part: None });
            }
        }
        for batch in ops::batches(items) {
            ops::schedule(&self.ctx, Kind::Pull, batch, priority, None);
        }
        Ok(report)
    }

    /// Push then pull as one request per server: the reply carries the updated values.
    pub(crate) fn pushpull(&self, push: Vec<(Key, &NDArray)>, pull: Vec<(Key, &NDArray)>, priority: Priority) -> crate::Result<()> {
        let op = "pushpull";
        let compression = *self.compression.lock();
        let mut items = self.push_items(op, push, compression.is_some())?;
        let outs = self.registry.lock().group(op, pull)?;
        if outs.len() != items.len() || outs.iter().zip(&items).any(|(o, i)| o.info.key != i.info.key) {
            return Err(unsupported(op, &self.name, "the keys of the values and of the outputs differ; give both for the same keys").into());
        }
        for (item, g) in items.iter_mut().zip(outs) {
            if item.info.stype != StorageType::Dense {
                return Err(Error::UnsupportedStorage {
                    op,
                    key: item.info.key.clone(),
                    stype: item.info.stype,
                    hint: "pushpull takes dense keys only (spec K5.3); use push and row_sparse_pull",
                }
                .into());
            }
            for o in &g.arrays {
                check_array(op, &item.info, o, true)?;
                if o.storage_type() != StorageType::Dense {
                    return Err(Error::UnsupportedStorage {
                        op,
                        key: item.info.key.clone(),
                        stype: o.storage_type(),
                        hint: "pushpull writes dense outputs only",
                    }
                    .into());
                }
            }
            item.outs = g.arrays.into_iter().cloned().collect();
        }
        for batch in ops::batches(items) {
            ops::schedule(&self.ctx, Kind::PushPull, batch, priority, compression);
        }
        self.after_push()
    }

    pub(crate) fn row_sparse_pull(&self, triples: Vec<(Key, &NDArray, Vec<i64>)>, priority: Priority) -> crate::Result<()> {
        let op = "row_sparse_pull";
        let mut items = Vec::with_capacity(triples.len());
        {
            let reg = self.registry.lock();
            reg.check_kinds(op, triples.iter().map(|t| &t.0))?;
            for (key, out, ids) in triples {
                let info = reg.get(op, &key)?;
                if info.stype != StorageType::RowSparse {
                    return Err(Error::UnsupportedStorage {
                        op,
                        key,
                        stype: info.stype,
                        hint: "row_sparse_pull needs a key initialised with a row_sparse value; use pull for dense keys",
                    }
                    .into());
                }
                if out.storage_type() != StorageType::RowSparse {
                    return Err(Error::UnsupportedStorage {
                        op,
                        key,
                        stype: out.storage_type(),
                        hint: "row_sparse_pull writes into row_sparse outputs; create the output with NDArray::row_sparse_zeros",
                    }
                    .into());
                }
                check_array(op, &info, out, false)?;
                let rows = info.shape.rows();
                if let Some(&bad) = ids.iter().find(|&&i| usize::try_from(i).map_or(true, |i| i >= rows)) {
                    return Err(Error::RowIdOutOfRange { key, id: bad, rows }.into());
                }
                items.push(Item { info, inputs: SmallVec::new(), outs: smallvec::smallvec![out.clone()], ids, part: None });
            }
        }
        for item in items {
            ops::schedule(&self.ctx, Kind::RowSparsePull, vec![item], priority, None);
        }
        Ok(())
    }

    /// Sends the optimizer to every server (every worker does; identical configurations keep
    /// the servers' optimizer states).
    pub(crate) fn set_optimizer(&self, opt: Optimizer) -> crate::Result<()> {
        opt.validate()?;
        let json = opt.to_json();
        block(&self.handle, command_all(&self.ctx.client, ServerCmd::SetOptimizer, ops::body(&json)))?;
        *self.optimizer.lock() = Some(opt);
        Ok(())
    }

    pub(crate) fn has_optimizer(&self) -> bool {
        self.optimizer.lock().is_some()
    }

    /// Waits for this process's operations, then leaves the cluster (see the module docs).
    pub(crate) fn close(&self) -> crate::Result<()> {
        let Some(worker) = self.worker.lock().take() else { return Ok(()) };
        let pending = Engine::global().wait_all();
        let finished = block(&self.handle, worker.finish());
        // The roles this process hosts serve the other workers until the job ends.
        let hosted = self.hosted.lock().take().map_or(Ok(()), Hosted::wait);
        crate::ps::trace::finish(Role::Worker);
        ACTIVE.store(false, Ordering::Release);
        pending?;
        finished?;
        hosted?;
        Ok(())
    }

    fn settled(&self, op: &'static str) -> crate::Result<()> {
        if self.optimizer.lock().is_none() {
            return Err(unsupported(op, &self.name, "no optimizer is installed; call set_optimizer first").into());
        }
        let vars: Vec<_> = self.registry.lock().all().flat_map(|k| k.vars.iter().cloned()).collect();
        for v in vars {
            // Failures were reported to pulls and waits already; here we only wait.
            let _ = Engine::global().wait_to_write(&v);
        }
        Ok(())
    }
}

impl Drop for DistStore {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!("closing the {} store: {e}", self.name);
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

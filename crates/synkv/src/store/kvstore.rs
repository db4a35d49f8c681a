//! [`KVStore`]: the public store surface, and [`create`].

use std::fmt;
use std::sync::Arc;

use super::args::flatten;
use super::distributed::{CheckpointInfo, DistStore, ServerStats};
use super::local::LocalStore;
use super::{Arrays, Error, Key, Keys, StoreType};
use crate::engine::{Engine, Priority};
use crate::NDArray;

/// An updater: `(key, merged input, stored value)`, called once per key per push on the
/// summed value; it changes `stored` in place (or replaces it with an array of the same shape
/// and dtype). It runs on an engine thread, one call at a time. Use only synchronous array
/// operations on its arguments, and do not keep them past the call.
pub type Updater = Arc<dyn Fn(&Key, &NDArray, &mut NDArray) -> crate::Result<()> + Send + Sync + 'static>;

/// Options of a pull.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PullOptions {
    /// Engine priority: among ready operations, higher runs first.
    pub priority: Priority,
    /// Skip row_sparse outputs (MXNet's default, `true`); the skipped keys are reported in
    /// the returned [`PullReport`] and logged. With `false`, row_sparse outputs receive every
    /// row.
    pub ignore_sparse: bool,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions { priority: 0, ignore_sparse: true }
    }
}

/// What a pull did besides writing its outputs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullReport {
    /// Keys whose row_sparse outputs were skipped because `ignore_sparse` was set (MXNet
    /// skips them with only an INFO log; synkv returns them, and logs a warning).
    pub skipped_sparse: Vec<Key>,
}

impl PullReport {
    /// Whether every output was written.
    pub fn is_complete(&self) -> bool {
        self.skipped_sparse.is_empty()
    }
}

enum Backend {
    Local(LocalStore),
    Dist(Box<DistStore>),
}

/// A key-value store of n-d arrays: MXNet's KVStore.
///
/// Every call validates its arguments at once (an error leaves the store unchanged), then
/// schedules the work on the dependency engine and returns. Reading an output
/// ([`NDArray::wait_to_read`], [`NDArray::to_vec`]) or [`KVStore::wait_all`] waits for it.
pub struct KVStore {
    name: String,
    kind: StoreType,
    backend: Backend,
}

/// Creates a store of the given type: `local`, `device`, or one of MXNet's aliases
/// (`local_update_cpu`, `local_allreduce_cpu`, `local_allreduce_device`). Names are
/// case-insensitive; [`KVStore::type_name`] returns the lower-cased name as given.
///
/// The distributed types (`dist_sync`, `dist_async`, `dist_device_sync`, and the aliases
/// `dist`, `dist_sync_device`) join the cluster described by the `DMLC_*` environment as a
/// worker; see `docs/dist.md`.
pub fn create(name: &str) -> crate::Result<KVStore> {
    let kind = StoreType::parse(name)?;
    let backend = match kind {
        StoreType::Local | StoreType::Device => Backend::Local(LocalStore::new()),
        dist => Backend::Dist(Box::new(DistStore::create(dist, &name.to_ascii_lowercase())?)),
    };
    Ok(KVStore { name: name.to_ascii_lowercase(), kind, backend })
}

impl KVStore {
    /// The store type's name as given to [`create`], lower-cased (MXNet's `type`).
    pub fn type_name(&self) -> &str {
        &self.name
    }

    /// The parsed store type.
    pub fn store_type(&self) -> StoreType {
        self.kind
    }

    /// This worker's rank: 0 for in-process stores.
    pub fn rank(&self) -> usize {
        match &self.backend {
            Backend::Local(_) => 0,
            Backend::Dist(s) => s.rank(),
        }
    }

    /// The number of workers: 1 for in-process stores.
    pub fn num_workers(&self) -> usize {
        match &self.backend {
            Backend::Local(_) => 1,
            Backend::Dist(s) => s.num_workers(),
        }
    }

    /// The number of servers: 0 for in-process stores.
    pub fn num_servers(&self) -> usize {
        match &self.backend {
            Backend::Local(_) => 0,
            Backend::Dist(s) => s.num_servers(),
        }
    }

    /// Initialises keys with values (copied; later changes to `values` do not reach the
    /// store). Each key is initialised once.
    pub fn init<'a>(&self, keys: impl Into<Keys>, values: impl Into<Arrays<'a>>) -> crate::Result<()> {
        let pairs = flatten("init", keys.into(), values.into())?;
        match &self.backend {
            Backend::Local(s) => s.init(pairs),
            Backend::Dist(s) => s.init(pairs),
        }
    }

    /// Pushes values: all values of one key (a per-device list, or the key repeated) are
    /// summed, then the updater runs on the sum, or the sum is assigned. Priority 0.
    pub fn push<'a>(&self, keys: impl Into<Keys>, values: impl Into<Arrays<'a>>) -> crate::Result<()> {
        self.push_with_priority(keys, values, 0)
    }

    /// [`KVStore::push`] with an engine priority.
    pub fn push_with_priority<'a>(&self, keys: impl Into<Keys>, values: impl Into<Arrays<'a>>, priority: Priority) -> crate::Result<()> {
        let pairs = flatten("push", keys.into(), values.into())?;
        match &self.backend {
            Backend::Local(s) => s.push(pairs, priority),
            Backend::Dist(s) => s.push(pairs, priority),
        }
    }

    /// Pulls values into outputs (a list of outputs for one key: each gets the value).
    /// Row_sparse outputs are skipped and logged; see [`KVStore::pull_with`].
    pub fn pull<'a>(&self, keys: impl Into<Keys>, outs: impl Into<Arrays<'a>>) -> crate::Result<()> {
        warn_skipped(&self.pull_with(keys, outs, PullOptions::default())?);
        Ok(())
    }

    /// Pulls with explicit options; reports which outputs were skipped.
    pub fn pull_with<'a>(&self, keys: impl Into<Keys>, outs: impl Into<Arrays<'a>>, options: PullOptions) -> crate::Result<PullReport> {
        let pairs = flatten("pull", keys.into(), outs.into())?;
        match &self.backend {
            Backend::Local(s) => s.pull(pairs, options.priority, options.ignore_sparse),
            Backend::Dist(s) => s.pull(pairs, options.priority, options.ignore_sparse),
        }
    }

    /// Push then pull as one call: the pulled value is the updated one.
    pub fn pushpull<'a>(&self, keys: impl Into<Keys>, values: impl Into<Arrays<'a>>, outs: impl Into<Arrays<'a>>) -> crate::Result<()> {
        self.pushpull_impl(keys.into(), values.into(), Some(outs.into()), 0)
    }

    /// Push then pull the result back into the pushed arrays themselves (MXNet's `out=None`).
    pub fn pushpull_in_place<'a>(&self, keys: impl Into<Keys>, values: impl Into<Arrays<'a>>) -> crate::Result<()> {
        self.pushpull_impl(keys.into(), values.into(), None, 0)
    }

    /// [`KVStore::pushpull_in_place`] with an engine priority.
    pub fn pushpull_in_place_with_priority<'a>(
        &self,
        keys: impl Into<Keys>,
        values: impl Into<Arrays<'a>>,
        priority: Priority,
    ) -> crate::Result<()> {
        self.pushpull_impl(keys.into(), values.into(), None, priority)
    }

    /// [`KVStore::pushpull`] with an engine priority.
    pub fn pushpull_with_priority<'a>(
        &self,
        keys: impl Into<Keys>,
        values: impl Into<Arrays<'a>>,
        outs: impl Into<Arrays<'a>>,
        priority: Priority,
    ) -> crate::Result<()> {
        self.pushpull_impl(keys.into(), values.into(), Some(outs.into()), priority)
    }

    fn pushpull_impl<'a>(&self, keys: Keys, values: Arrays<'a>, outs: Option<Arrays<'a>>, priority: Priority) -> crate::Result<()> {
        let push_pairs = flatten("pushpull", keys.clone(), values.clone())?;
        let pull_pairs = flatten("pushpull", keys, outs.unwrap_or(values))?;
        match &self.backend {
            Backend::Local(s) => {
                // Validate both halves before scheduling either, so an error changes nothing.
                let push = s.prepare_push("pushpull", push_pairs)?;
                let pull = s.prepare_pull("pushpull", pull_pairs, true)?;
                s.schedule_push(push, priority);
                warn_skipped(&s.schedule_pull(pull, priority));
                Ok(())
            }
            Backend::Dist(s) => s.pushpull(push_pairs, pull_pairs, priority),
        }
    }

    /// `init(keys, values)` then `pull(keys, outs)`: the value reaches every output. Each key
    /// is initialised once, so a key can be broadcast once.
    pub fn broadcast<'a>(&self, keys: impl Into<Keys>, values: impl Into<Arrays<'a>>, outs: impl Into<Arrays<'a>>) -> crate::Result<()> {
        self.broadcast_with_priority(keys, values, outs, 0)
    }

    /// [`KVStore::broadcast`] with an engine priority.
    pub fn broadcast_with_priority<'a>(
        &self,
        keys: impl Into<Keys>,
        values: impl Into<Arrays<'a>>,
        outs: impl Into<Arrays<'a>>,
        priority: Priority,
    ) -> crate::Result<()> {
        let keys = keys.into();
        let init_pairs = flatten("broadcast", keys.clone(), values.into())?;
        let pull_pairs = flatten("broadcast", keys, outs.into())?;
        for (key, out) in &pull_pairs {
            if let Some((_, v)) = init_pairs.iter().find(|(k, _)| k == key) {
                if v.shape() != out.shape() {
                    return Err(Error::ShapeMismatch {
                        op: "broadcast",
                        key: key.clone(),
                        expected: v.shape().clone(),
                        got: out.shape().clone(),
                    }
                    .into());
                }
            }
        }
        match &self.backend {
            Backend::Local(s) => {
                s.init(init_pairs)?;
                warn_skipped(&s.pull(pull_pairs, priority, true)?);
                Ok(())
            }
            Backend::Dist(s) => {
                s.init(init_pairs)?;
                warn_skipped(&s.pull(pull_pairs, priority, true)?);
                Ok(())
            }
        }
    }

    /// Pulls only the rows `row_ids` of row_sparse keys into row_sparse outputs (spec K5.8–
    /// K5.11). Row ids may have any numeric dtype and shape, be unsorted and repeat: they are
    /// sorted and de-duplicated. Each output gets exactly the requested rows (zeros for rows
    /// the key does not hold). Give one row-id array per output, or one for all outputs of a
    /// single key.
    pub fn row_sparse_pull<'a>(
        &self,
        keys: impl Into<Keys>,
        outs: impl Into<Arrays<'a>>,
        row_ids: impl Into<Arrays<'a>>,
    ) -> crate::Result<()> {
        self.row_sparse_pull_with_priority(keys, outs, row_ids, 0)
    }

    /// [`KVStore::row_sparse_pull`] with an engine priority.
    pub fn row_sparse_pull_with_priority<'a>(
        &self,
        keys: impl Into<Keys>,
        outs: impl Into<Arrays<'a>>,
        row_ids: impl Into<Arrays<'a>>,
        priority: Priority,
    ) -> crate::Result<()> {
        let op = "row_sparse_pull";
        let keys = keys.into();
        let out_pairs = flatten(op, keys.clone(), outs.into())?;
        let row_ids = row_ids.into();
        let id_arrays: Vec<&NDArray> = match (&keys, row_ids) {
            (Keys::One(_), Arrays::One(ids)) => vec![ids; out_pairs.len()],
            (keys, ids) => {
                let pairs = match flatten(op, keys.clone(), ids) {
                    Ok(p) => p,
                    Err(Error::LengthMismatch { values, .. }) => {
                        return Err(Error::RowIdsMismatch { outputs: out_pairs.len(), row_ids: values }.into())
                    }
                    Err(e) => return Err(e.into()),
                };
                if pairs.len() != out_pairs.len() {
                    return Err(Error::RowIdsMismatch { outputs: out_pairs.len(), row_ids: pairs.len() }.into());
                }
                pairs.into_iter().map(|p| p.1).collect()
            }
        };
        let mut triples = Vec::with_capacity(out_pairs.len());
        for ((key, out), ids) in out_pairs.into_iter().zip(id_arrays) {
            if ids.storage_type() != crate::StorageType::Dense {
                return Err(Error::InvalidRowIds { key, reason: "row ids must be a dense array".into() }.into());
            }
            let raw = ids.to_vec::<f64>()?;
            if let Some(bad) = raw.iter().find(|x| !x.is_finite() || x.fract() != 0.0) {
                return Err(Error::InvalidRowIds { key, reason: format!("row id {bad} is not an integer") }.into());
            }
            let mut v: Vec<i64> = raw.into_iter().map(|x| x as i64).collect();
            crate::ndarray::sparse::normalize_row_ids(&mut v);
            triples.push((key, out, v));
        }
        match &self.backend {
            Backend::Local(s) => s.row_sparse_pull(triples, priority),
            Backend::Dist(s) => s.row_sparse_pull(triples, priority),
        }
    }

    /// Installs an updater `(key, merged, stored)`; see [`Updater`]. Pushes scheduled before
    /// keep the updater they were scheduled with.
    pub fn set_updater<F>(&self, updater: F)
    where
        F: Fn(&Key, &NDArray, &mut NDArray) -> crate::Result<()> + Send + Sync + 'static,
    {
        match &self.backend {
            Backend::Local(s) => s.set_updater(Some(Arc::new(updater))),
            // Updates run on the servers: a local updater has no effect (spec K6.2).
            Backend::Dist(_) => tracing::warn!("set_updater has no effect on a {} store; use set_optimizer", self.name),
        }
    }

    /// Turns on gradient compression (MXNet's `set_gradient_compression`), configured by
    /// MXNet's string pairs: `type` (`"2bit"` or `"1bit"`, required) and `threshold` (default
    /// 0.5; 2bit needs > 0). A `device` store then quantizes every pushed dense f32 value with
    /// a residual per (key, source) and sums the dequantized values (spec K7.9); a distributed
    /// store's worker sums its devices, quantizes with a residual per key and sends the packed
    /// words, which the servers dequantize (K7.10; pulls stay uncompressed). A `local` store
    /// refuses, as in MXNet. Once set, pushing anything but dense f32 values is an error.
    pub fn set_gradient_compression<I, K, V>(&self, params: I) -> crate::Result<()>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let gc = crate::compression::GradientCompression::from_pairs(params)?;
        match (&self.backend, self.kind) {
            (Backend::Local(s), StoreType::Device) => {
                s.set_compression(gc);
                Ok(())
            }
            (Backend::Local(_), _) => Err(Error::Unsupported {
                op: "set_gradient_compression",
                store_type: self.name.clone(),
                reason: "gradient compression is not supported for this type of kvstore; use a `device` store".into(),
            }
            .into()),
            (Backend::Dist(d), _) => {
                d.set_compression(gc);
                Ok(())
            }
        }
    }

    /// Installs an optimizer (MXNet's `set_optimizer`): every push then runs it on the merged
    /// gradient of each key. Replaces any updater; optimizer states start empty.
    pub fn set_optimizer(&self, optimizer: crate::optimizer::Optimizer) -> crate::Result<()> {
        match &self.backend {
            Backend::Local(s) => s.set_optimizer(optimizer),
            Backend::Dist(s) => s.set_optimizer(optimizer),
        }
    }

    /// Saves the optimizer's states (and its configuration) to `path`, after every scheduled
    /// update has run. The format is documented in `docs/optimizer-states.md`.
    pub fn save_optimizer_states(&self, path: impl AsRef<std::path::Path>) -> crate::Result<()> {
        match &self.backend {
            Backend::Local(s) => s.save_optimizer_states(path.as_ref(), &self.name),
            Backend::Dist(s) => s.save_optimizer_states(path.as_ref()),
        }
    }

    /// Loads optimizer states saved by [`KVStore::save_optimizer_states`]; a file from another
    /// optimizer or a corrupted file is an error and changes nothing.
    pub fn load_optimizer_states(&self, path: impl AsRef<std::path::Path>) -> crate::Result<()> {
        match &self.backend {
            Backend::Local(s) => s.load_optimizer_states(path.as_ref(), &self.name),
            Backend::Dist(s) => s.load_optimizer_states(path.as_ref()),
        }
    }

    /// Removes the updater: pushes assign the sum again.
    pub fn clear_updater(&self) {
        match &self.backend {
            Backend::Local(s) => s.set_updater(None),
            Backend::Dist(_) => {}
        }
    }

    /// Whether an updater is installed.
    pub fn has_updater(&self) -> bool {
        match &self.backend {
            Backend::Local(s) => s.has_updater(),
            Backend::Dist(s) => s.has_optimizer(),
        }
    }

    /// A barrier across workers: a no-op for in-process stores. It does not wait for
    /// pending pushes and pulls (spec K12.19).
    pub fn barrier(&self) -> crate::Result<()> {
        match &self.backend {
            Backend::Local(_) => Ok(()),
            Backend::Dist(s) => s.barrier(),
        }
    }

    /// Takes a consistent checkpoint of the servers' state (values, optimizer states and
    /// counts, round ids) into `dir`: every worker of a dist job calls it at the same point of
    /// training (it meets the others at barriers, after its own operations are done), and every
    /// worker gets the same [`CheckpointInfo`]. A job started with `SYNKV_CHECKPOINT_DIR=dir`
    /// resumes from the newest one (`docs/checkpoints.md`). Not available on in-process stores
    /// (their state is in this process: save your arrays and `save_optimizer_states`).
    pub fn checkpoint(&self, dir: impl AsRef<std::path::Path>) -> crate::Result<CheckpointInfo> {
        match &self.backend {
            Backend::Local(_) => Err(Error::Unsupported {
                op: "checkpoint",
                store_type: self.name.clone(),
                reason: "checkpoints hold the servers' state of a dist store; save an in-process store's arrays and save_optimizer_states instead".into(),
            }
            .into()),
            Backend::Dist(s) => s.checkpoint(dir.as_ref()),
        }
    }

    /// The round (rank 0's `push` calls before it) of the checkpoint this dist job resumed
    /// from, when it was started with `SYNKV_CHECKPOINT_DIR` holding one: the program should
    /// go on from there (the rounds after it were lost). `None` otherwise.
    pub fn resumed_round(&self) -> Option<u64> {
        match &self.backend {
            Backend::Local(_) => None,
            Backend::Dist(s) => s.resumed_round(),
        }
    }

    /// The servers' statistics (memory, key parts, held bytes, waiting requests), by server
    /// rank; an in-process store has no servers and returns an empty list.
    pub fn server_stats(&self) -> crate::Result<Vec<ServerStats>> {
        match &self.backend {
            Backend::Local(_) => Ok(Vec::new()),
            Backend::Dist(s) => s.server_stats(),
        }
    }

    /// Waits for every scheduled operation and, on a dist store, leaves the cluster: tells
    /// the scheduler this worker is done and waits until every worker is (servers and the
    /// scheduler then exit). Dropping the store does the same but can only log a failure.
    pub fn close(&self) -> crate::Result<()> {
        match &self.backend {
            Backend::Local(_) => self.wait_all(),
            Backend::Dist(s) => s.close(),
        }
    }

    /// Waits until every update (updater or optimizer call) of this store's pushes scheduled so
    /// far has run. A push returns before its update (it only waits, if asked, until its values
    /// are consumed); this is for front-ends that run updaters on the caller's thread and must
    /// not return before them. Update failures are not returned here: they are reported, as
    /// always, by the next pull of the key and by `wait_all`. A no-op on distributed stores,
    /// whose updates run on the servers.
    pub fn wait_updates(&self) {
        if let Backend::Local(s) = &self.backend {
            s.wait_updates();
        }
    }

    /// Waits for every scheduled operation (of every store in the process) to complete;
    /// returns the first error an operation raised since the last `wait_all`.
    pub fn wait_all(&self) -> crate::Result<()> {
        Engine::global().wait_all().map_err(Into::into)
    }
}

/// Logs the keys whose row_sparse outputs a pull skipped (MXNet only logs at INFO level).
fn warn_skipped(report: &PullReport) {
    if !report.is_complete() {
        tracing::warn!(keys = ?report.skipped_sparse, "pull skipped row_sparse outputs (ignore_sparse); use row_sparse_pull for them");
    }
}

impl fmt::Debug for KVStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KVStore").field("type", &self.name).finish_non_exhaustive()
    }
}

//! Saving and loading the servers' optimizer states from a worker, as one file.
//!
//! Save: after this worker's scheduled operations, every server sends its states
//! (`GetOptimizerStates`); the slices of each split key are joined in order
//! (`OptimizerState::concat`) and the whole is written in `optimizer::format` — the same file
//! a local store writes, so it loads into either kind of store. Load: the file is read, each
//! key's state is cut into its servers' slices (`OptimizerState::slice`) and every server gets
//! its part (`SetOptimizerStates`); a server refuses states of another optimizer. Any worker
//! may call either; the other workers should not push meanwhile (as with MXNet's updater).

use std::path::Path;

use super::{block, command_all, unsupported, DistStore};
use crate::optimizer::{OptimizerState, Updater};
use crate::ps::proto::Message;
use crate::ps::ServerCmd;

impl DistStore {
    /// Fetches every server's optimizer states and writes them to one file.
    pub(crate) fn save_optimizer_states(&self, path: &Path) -> crate::Result<()> {
        let op = "save_optimizer_states";
        self.settled(op)?;
        let opt = self.optimizer.lock().clone().ok_or_else(|| unsupported(op, &self.name, "no optimizer is installed"))?;
        let replies = block(&self.handle, command_all(&self.ctx.client, ServerCmd::GetOptimizerStates, bytes::Bytes::new()))?;
        let mut parts = Vec::with_capacity(replies.len());
        for reply in &replies {
            let body = reply.chunks.first().map(|c| c.data.clone()).unwrap_or_default();
            parts.push(Updater::from_saved_states(&body)?);
        }
        let mut whole = Updater::try_new(opt)?;
        for p in &parts {
            whole.raise_num_update(p.num_update());
        }
        let keys: Vec<_> = self.registry.lock().all().cloned().collect();
        for info in keys {
            let name = info.key.to_string();
            let mut slices = info.slices.clone();
            slices.sort_by_key(|s| s.offset);
            let found: Vec<Option<(&OptimizerState, Option<u64>)>> = slices
                .iter()
                .map(|s| parts.get(s.server as usize).and_then(|u| u.state(&name).map(|st| (st, u.update_count(&name)))))
                .collect();
            if found.iter().all(Option::is_none) {
                continue; // never updated
            }
            let Some(found) = found.into_iter().collect::<Option<Vec<_>>>() else {
                return Err(unsupported(op, &self.name, format!("the servers hold states for only some slices of key {name}")).into());
            };
            let states: Vec<&OptimizerState> = found.iter().map(|(s, _)| *s).collect();
            let count = found.iter().filter_map(|(_, c)| *c).max();
            whole.set_state(&name, OptimizerState::concat(&name, &states)?, count);
        }
        whole.save_states_to(path)?;
        Ok(())
    }

    /// Reads a state file and sends each server the states of its slices.
    pub(crate) fn load_optimizer_states(&self, path: &Path) -> crate::Result<()> {
        let op = "load_optimizer_states";
        self.settled(op)?;
        let opt = self.optimizer.lock().clone().ok_or_else(|| unsupported(op, &self.name, "no optimizer is installed"))?;
        let bytes = std::fs::read(path).map_err(|source| crate::optimizer::Error::Io { action: "read", path: path.to_owned(), source })?;
        let whole = Updater::from_saved_states(&bytes)?;
        let mut per_server: Vec<Updater> = Vec::new();
        for _ in 0..self.num_servers {
            let mut u = Updater::try_new(opt.clone())?;
            u.raise_num_update(whole.num_update());
            per_server.push(u);
        }
        let registry = self.registry.lock();
        let mut names: Vec<String> = whole.state_keys().map(str::to_owned).collect();
        names.sort();
        for name in names {
            let Some(info) = registry.all().find(|k| k.key.to_string() == name).cloned() else {
                return Err(unsupported(
                    op,
                    &self.name,
                    format!("the file holds states of key {name}, which this store has not initialised"),
                )
                .into());
            };
            let Some(state) = whole.state(&name) else { continue };
            let unit = info.unit();
            for s in &info.slices {
                let part = state.slice(s.offset * unit, s.len * unit).ok_or_else(|| {
                    unsupported(
                        op,
                        &self.name,
                        format!("the state of key {name} has {} elements, the key {}", state.len(), info.shape.size()),
                    )
                })?;
                if let Some(u) = per_server.get_mut(s.server as usize) {
                    u.set_state(&name, part, whole.update_count(&name));
                }
            }
        }
        drop(registry);
        let msgs: Vec<(u32, Message)> = per_server
            .iter()
            .enumerate()
            .map(|(i, u)| {
                (u32::try_from(i).unwrap_or(u32::MAX), Message::server_command(ServerCmd::SetOptimizerStates.id(), u.save_states().into()))
            })
            .collect();
        block(&self.handle, self.ctx.client.request_all(msgs))?;
        Ok(())
    }
}

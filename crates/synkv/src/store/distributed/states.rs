//! Saving and loading the servers' optimizer states from a worker, as one file, and the
//! servers' statistics.
//!
//! Save: after this worker's scheduled operations, every server sends its states in pages
//! (`GetOptimizerStates` with a cursor, each page at most `SYNKV_PARTITION_BYTES` but for a
//! single larger state, so states of any size cross frames of any size); the parts of each
//! split key are joined in order (`OptimizerState::concat`) and the whole is written in
//! `optimizer::format` — the same file a local store writes, so it loads into either kind of
//! store. Load: the file is read, each key's state is cut into its parts
//! (`OptimizerState::slice`) and every server gets its parts in pages (`SetOptimizerStates`,
//! the first page replacing whatever the server held). A server refuses states of another
//! optimizer. Any worker may call either; the other workers should not push meanwhile (as
//! with MXNet's updater).
//!
//! On a server, the state of a key part is kept under the key's name for its first part and
//! `name@offset` for the others (`ps::server`), which is how parts are found here.

use std::path::Path;

use serde::Deserialize;

use super::{block, command_all, unsupported, DistStore};
use crate::optimizer::{OptimizerState, Updater};
use crate::ps::proto::Message;
use crate::ps::ServerCmd;

/// The key a server keeps the state of the part at `offset` of key `name` under.
fn state_key(name: &str, offset: usize) -> String {
    if offset == 0 {
        name.to_owned()
    } else {
        format!("{name}@{offset}")
    }
}

#[derive(Deserialize)]
struct Cursor {
    next: Option<String>,
}

/// Statistics a server reports (`ServerCmd::Stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct ServerStats {
    /// Resident memory now, in bytes (`None` where the server's OS does not tell).
    pub rss_bytes: Option<u64>,
    /// Peak resident memory since the server started, in bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Key parts held.
    pub entries: u64,
    /// Bytes of pushes held unsummed in open sync rounds.
    pub held_bytes: u64,
    /// Requests waiting for sync rounds.
    pub pending_requests: u64,
}

impl DistStore {
    /// Fetches every server's optimizer states, page by page, and writes them to one file.
    pub(crate) fn save_optimizer_states(&self, path: &Path) -> crate::Result<()> {
        let op = "save_optimizer_states";
        self.settled(op)?;
        let opt = self.optimizer.lock().clone().ok_or_else(|| unsupported(op, &self.name, "no optimizer is installed"))?;
        let mut parts = Vec::with_capacity(self.num_servers as usize);
        for server in 0..self.num_servers {
            let mut held = Updater::try_new(opt.clone())?;
            let mut after: Option<String> = None;
            loop {
                let body = serde_json::json!({ "after": after }).to_string();
                let msg = Message::server_command(ServerCmd::GetOptimizerStates.id(), body.into());
                let reply = block(&self.handle, self.ctx.client.request_all(vec![(server, msg)]))?.remove(0);
                let page = reply.chunks.first().map(|c| c.data.clone()).unwrap_or_default();
                held.merge_states(&page, false)?;
                let cursor: Cursor = serde_json::from_str(&reply.meta.text).map_err(|e| {
                    unsupported(
                        op,
                        &self.name,
                        format!("server {server} answered a page without a cursor ({e}); are all nodes the same synkv version?"),
                    )
                })?;
                match cursor.next {
                    Some(k) => after = Some(k),
                    None => break,
                }
            }
            parts.push(held);
        }
        let mut whole = Updater::try_new(opt)?;
        for p in &parts {
            whole.raise_num_update(p.num_update());
        }
        let keys: Vec<_> = self.registry.lock().all().cloned().collect();
        for info in keys {
            let name = info.key.to_string();
            let found: Vec<Option<(&OptimizerState, Option<u64>)>> = info
                .slices
                .iter()
                .map(|s| {
                    let key = state_key(&name, s.offset);
                    parts.get(s.server as usize).and_then(|u| u.state(&key).map(|st| (st, u.update_count(&key))))
                })
                .collect();
            if found.iter().all(Option::is_none) {
                continue; // never updated
            }
            let Some(found) = found.into_iter().collect::<Option<Vec<_>>>() else {
                return Err(unsupported(op, &self.name, format!("the servers hold states for only some parts of key {name}")).into());
            };
            let states: Vec<&OptimizerState> = found.iter().map(|(s, _)| *s).collect();
            let count = found.iter().filter_map(|(_, c)| *c).max();
            whole.set_state(&name, OptimizerState::concat(&name, &states)?, count);
        }
        whole.save_states_to(path)?;
        Ok(())
    }

    /// Reads a state file and sends each server the states of its key parts, in pages.
    pub(crate) fn load_optimizer_states(&self, path: &Path) -> crate::Result<()> {
        let op = "load_optimizer_states";
        self.settled(op)?;
        let opt = self.optimizer.lock().clone().ok_or_else(|| unsupported(op, &self.name, "no optimizer is installed"))?;
        let bytes = std::fs::read(path).map_err(|source| crate::optimizer::Error::Io { action: "read", path: path.to_owned(), source })?;
        let whole = Updater::from_saved_states(&bytes)?;
        drop(bytes);
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
                    u.set_state(&state_key(&name, s.offset), part, whole.update_count(&name));
                }
            }
        }
        drop(registry);
        drop(whole);
        let page_bytes = usize::try_from(self.layout.partition_bytes).unwrap_or(usize::MAX);
        for (server, u) in (0u32..).zip(&per_server) {
            let mut keys: Vec<&str> = u.state_keys().collect();
            keys.sort_unstable();
            let mut pages: Vec<Vec<&str>> = vec![Vec::new()];
            let mut size = 0usize;
            for k in keys {
                let b = u.state_bytes(k) + k.len() + 256;
                if size + b > page_bytes && pages.last().is_some_and(|p| !p.is_empty()) {
                    pages.push(Vec::new());
                    size = 0;
                }
                size += b;
                if let Some(p) = pages.last_mut() {
                    p.push(k);
                }
            }
            // The first page (possibly empty) replaces what the server held.
            for (i, page) in pages.iter().enumerate() {
                let mut msg = Message::server_command(ServerCmd::SetOptimizerStates.id(), u.save_states_of(page).into());
                msg.meta.text = if i == 0 { "replace".into() } else { "merge".into() };
                block(&self.handle, self.ctx.client.request_all(vec![(server, msg)]))?;
            }
        }
        Ok(())
    }

    /// Every server's statistics, by server rank.
    pub(crate) fn server_stats(&self) -> crate::Result<Vec<ServerStats>> {
        let replies = block(&self.handle, command_all(&self.ctx.client, ServerCmd::Stats, bytes::Bytes::new()))?;
        replies
            .iter()
            .map(|r| {
                let body = r.chunks.first().map(|c| c.data.clone()).unwrap_or_default();
                serde_json::from_slice(&body)
                    .map_err(|e| unsupported("server_stats", &self.name, format!("a server sent unreadable statistics: {e}")).into())
            })
            .collect()
    }
}

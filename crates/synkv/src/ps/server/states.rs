//! Optimizer states in pages, and the server's statistics.
//!
//! A server's optimizer states may be far larger than a frame (`SYNKV_MAX_FRAME_BYTES`), so
//! they travel in pages of at most `page_bytes` (one state larger than that alone):
//!
//! - `GetOptimizerStates` — body: JSON `{"after": KEY | null}` (empty body: from the start);
//!   reply: chunk 0 = the `optimizer::format` bytes of the states of the next keys in sorted
//!   order (with their counts and the updater's `num_update`), text = JSON
//!   `{"next": KEY | null}`, the key to continue after (`null`: that was the last page).
//! - `SetOptimizerStates` — body: `optimizer::format` bytes of some keys' states; text
//!   `replace` forgets every state first (the first page of a load), anything else adds to
//!   the states held.
//!
//! State keys are the entries' [`state_key`](super::entry::Entry::state_key)s: the key's name,
//! or `name@offset` for a part past the first.

use serde::{Deserialize, Serialize};

use super::error::ServerError;
use crate::optimizer::Updater;
use crate::ps::proto::{Chunk, Command, ErrorCode, Message};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PageRequest {
    after: Option<String>,
}

#[derive(Serialize)]
struct PageCursor<'a> {
    next: Option<&'a str>,
}

/// The sorted state keys, kept between the pages of one save.
#[derive(Default)]
pub(super) struct Pager {
    sorted: Vec<String>,
}

impl Pager {
    /// The page of states after the request's cursor.
    pub(super) fn page(&mut self, u: &Updater, body: &[u8], page_bytes: usize) -> Result<Message, ServerError> {
        let req: PageRequest = if body.is_empty() {
            PageRequest { after: None }
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ServerError::invalid(format!("GetOptimizerStates: the body is not {{\"after\": key|null}}: {e}")))?
        };
        if req.after.is_none() || self.sorted.len() != u.state_count() {
            // A new save (or states were added since): take the keys afresh.
            self.sorted = u.state_keys().map(str::to_owned).collect();
            self.sorted.sort();
        }
        let start = match &req.after {
            None => 0,
            Some(k) => self.sorted.partition_point(|s| s.as_str() <= k.as_str()),
        };
        let mut keys: Vec<&str> = Vec::new();
        let mut bytes = 0usize;
        for k in &self.sorted[start..] {
            let b = u.state_bytes(k).saturating_add(k.len() + 256);
            if !keys.is_empty() && bytes.saturating_add(b) > page_bytes {
                break;
            }
            bytes = bytes.saturating_add(b);
            keys.push(k);
        }
        let next = (start + keys.len() < self.sorted.len()).then(|| keys.last().copied()).flatten();
        let mut reply = Message::new(Command::Reply);
        reply.chunks.push(Chunk::bytes(u.save_states_of(&keys)));
        reply.meta.text = serde_json::to_string(&PageCursor { next }).unwrap_or_default();
        Ok(reply)
    }

    /// Loads a page of states (`mode` = `replace` for the first page of a load).
    pub(super) fn load(&mut self, u: &mut Updater, body: &[u8], mode: &str) -> Result<Message, ServerError> {
        u.merge_states(body, mode == "replace")
            .map_err(|e| ServerError::new(ErrorCode::Optimizer, format!("load_optimizer_states: {e}")))?;
        self.sorted.clear();
        Ok(Message::new(Command::Reply))
    }
}

/// The server's statistics as JSON: its resident memory (current and peak, from
/// `/proc/self/status`, `null` where that does not exist), key parts, held bytes and
/// requests waiting for rounds.
pub(super) fn stats(entries: usize, held_bytes: usize, pending: usize) -> String {
    let (rss, peak) = memory();
    serde_json::json!({
        "rss_bytes": rss,
        "peak_rss_bytes": peak,
        "entries": entries,
        "held_bytes": held_bytes,
        "pending_requests": pending,
    })
    .to_string()
}

/// (VmRSS, VmHWM) in bytes.
fn memory() -> (Option<u64>, Option<u64>) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return (None, None) };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

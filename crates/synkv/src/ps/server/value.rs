//! Data messages as per-key [`Item`]s: which entry (ps key, offset), which round, what value.
//!
//! Message layout (the table in [`crate::ps::proto`]): a dense `Push`/`PushPull` carries one
//! chunk per key; a row_sparse one (flag `ROW_SPARSE`) two per key, the row ids (`i64`,
//! relative to the part's first row) then the rows; a compressed one (flag `COMPRESSED`)
//! packed words, with the configuration as JSON in the text field. Offsets (flag `OFFSETS`)
//! and round ids (flag `ROUNDS`) come per key from the meta. Only the layout is checked here;
//! values are checked against their entry (`entry.rs`) before anything changes.

use super::entry::EntryKey;
use super::error::ServerError;
use crate::compression::GradientCompression;
use crate::ps::proto::{Chunk, Flags, Message};

/// One key's part of a data message, before validation against the entry.
pub(super) enum Value {
    /// Every element of the entry.
    Dense(Chunk),
    /// Every element of the entry as gradient-compression words (`U32`).
    Packed(GradientCompression, Chunk),
    /// Some rows: ids (`i64` chunk) and their data.
    Rows { ids: Chunk, data: Chunk },
}

/// One key of a push: its entry, its round id (if the sender gave one) and its value.
pub(super) struct Item {
    pub(super) key: EntryKey,
    pub(super) round: Option<u64>,
    pub(super) value: Value,
}

/// The entry of key `i` of `msg`.
pub(super) fn entry_key(msg: &Message, i: usize) -> EntryKey {
    (msg.meta.keys[i], msg.meta.offsets.get(i).copied().unwrap_or(0))
}

/// The entries a message names, in order.
pub(super) fn entry_keys(msg: &Message) -> Vec<EntryKey> {
    (0..msg.meta.keys.len()).map(|i| entry_key(msg, i)).collect()
}

/// Splits a `Push`/`PushPull` into items, checking the chunk layout.
pub(super) fn push_items(msg: &Message) -> Result<Vec<Item>, ServerError> {
    let keys = &msg.meta.keys;
    let rows = msg.flags.contains(Flags::ROW_SPARSE);
    let packed = if msg.flags.contains(Flags::COMPRESSED) {
        if rows || msg.flags.contains(Flags::INIT) {
            return Err(ServerError::invalid(
                "compressed values are dense gradient pushes; row_sparse values and init values travel uncompressed",
            ));
        }
        let gc: GradientCompression = serde_json::from_str(&msg.meta.text)
            .map_err(|e| ServerError::invalid(format!("a compressed push needs its configuration as JSON in the text field: {e}")))?;
        Some(gc)
    } else {
        None
    };
    let per_key = if rows { 2 } else { 1 };
    if msg.chunks.len() != keys.len() * per_key {
        return Err(ServerError::invalid(format!("{} keys need {} chunks, got {}", keys.len(), keys.len() * per_key, msg.chunks.len())));
    }
    let mut out = Vec::with_capacity(keys.len());
    for i in 0..keys.len() {
        let value = if rows {
            Value::Rows { ids: msg.chunks[2 * i].clone(), data: msg.chunks[2 * i + 1].clone() }
        } else if let Some(gc) = packed {
            Value::Packed(gc, msg.chunks[i].clone())
        } else {
            Value::Dense(msg.chunks[i].clone())
        };
        out.push(Item { key: entry_key(msg, i), round: msg.meta.rounds.get(i).copied(), value });
    }
    Ok(out)
}

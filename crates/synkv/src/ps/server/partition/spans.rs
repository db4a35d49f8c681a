//! The server's spans for the trace timeline and the flight recorder (`ps::trace`): each
//! worker's push of an entry (arrival in the core to placed in its round — the last push of a
//! round includes the round's sum and update), the sum and the update of each round, each
//! pull answered. Offsets are the entry's (ps key, offset) offset; rounds are its round ids.

use std::sync::Arc;
use std::time::Instant;

use super::super::entry::Checked;
use crate::ps::trace::{self, Op, Recorder, Span};

/// The server's recorder, when it records.
pub(super) fn recorder() -> Option<&'static Recorder> {
    let rec = trace::recorder(crate::ps::Role::Server);
    rec.enabled().then_some(rec)
}

/// The value bytes of a checked push.
pub(super) fn checked_bytes(value: &Checked) -> u64 {
    let len = match value {
        Checked::Dense(c) | Checked::Packed(_, c) | Checked::Rows(_, c) => c.data.len(),
    };
    u64::try_from(len).unwrap_or(u64::MAX)
}

/// A completed round of entry `label` @ `offset`: its sum from `started`, then — if the
/// updater ran after the sum was complete (`summed`) — its update until `end`. Without that
/// split (an assign, or a row_sparse round) the whole is one span, `update` when an updater
/// ran, `sum` otherwise.
#[allow(clippy::too_many_arguments)]
pub(super) fn round(
    rec: &Recorder,
    (label, offset): (&Arc<str>, u64),
    round: u64,
    bytes: u64,
    (started, summed, end): (Instant, Option<Instant>, Instant),
    updating: bool,
    ok: bool,
) {
    let span = |op, from, to| Span::new(op, from, to).key(label, offset).bytes(bytes).round(round).ok(ok);
    match summed {
        Some(s) => rec.record_all([span(Op::Sum, started, s), span(Op::Update, s, end)]),
        None if updating => rec.record(span(Op::Update, started, end)),
        None => rec.record(span(Op::Sum, started, end)),
    }
}

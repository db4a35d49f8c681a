//! The worker's spans for the trace timeline and the flight recorder (`ps::trace`): the
//! partitioning of each pushed key, and each key part's request from send to answer, with
//! its server, bytes and round. Called only when the worker's recorder is on.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::build::Places;
use super::ops::{Item, Kind};
use crate::ps::trace::{Op, Recorder, Span};

/// A message sent: when, and the value bytes of each of its keys (the request's lengths:
/// what a push carries, what a pull expects back).
pub(crate) struct Sent {
    pub(crate) at: Instant,
    pub(crate) lens: Vec<u64>,
}

/// The op of a request span.
fn op(kind: Kind) -> Op {
    match kind {
        Kind::Push => Op::Push,
        Kind::Pull => Op::Pull,
        Kind::PushPull => Op::PushPull,
        Kind::RowSparsePull => Op::RowSparsePull,
    }
}

/// The pushed keys were summed, copied or quantized, and cut into parts from `started` to now
/// (one span per item: a key, or the one part it moves; on its first part's track, in the
/// round of that part's push).
pub(crate) fn partitioned(rec: &Recorder, kind: Kind, items: &[Item], started: Instant) {
    if !matches!(kind, Kind::Push | Kind::PushPull) {
        return;
    }
    let now = Instant::now();
    rec.record_all(items.iter().map(|it| {
        let info = &it.info;
        let first = it.parts().start;
        let units: usize = it.parts().filter_map(|p| info.slices.get(p)).map(|s| s.len).sum();
        let bytes = u64::try_from(units * info.unit() * info.dtype.size_of()).unwrap_or(u64::MAX);
        let offset = info.slices.get(first).map_or(0, |s| s.offset as u64);
        let round = info.rounds.get(first).map_or(0, |r| r.load(Ordering::Acquire));
        Span::new(Op::Partition, started, now).key(&info.label, offset).bytes(bytes).round(round)
    }));
}

/// A message's answer arrived (`ok`: and was used): one span per key part it carried.
/// `pushed` holds the round each part was pushed in, when the server counted the push.
pub(crate) fn answered(rec: &Recorder, kind: Kind, items: &[Item], place: &Places, sent: &Sent, pushed: &[u64], ok: bool) {
    let now = Instant::now();
    let op = op(kind);
    rec.record_all(place.iter().enumerate().filter_map(|(k, &(i, part, _))| {
        let info = &items.get(i)?.info;
        let slice = info.slices.get(part)?;
        let counted = info.rounds.get(part)?.load(Ordering::Acquire);
        let round = match kind {
            // A push not counted (failed) was for the round still counted.
            Kind::Push | Kind::PushPull => pushed.get(k).copied().unwrap_or(counted),
            // A pull reads the result of the last round pushed (see `ps::trace`).
            Kind::Pull | Kind::RowSparsePull => counted.saturating_sub(1),
        };
        let span = Span::new(op, sent.at, now)
            .key(&info.label, slice.offset as u64)
            .peer(slice.server)
            .bytes(sent.lens.get(k).copied().unwrap_or(0))
            .round(round)
            .ok(ok);
        Some(span)
    }));
}

/// A pull was answered from the values its keys' pushes asked back (`held.rs`), from
/// `started` to now: one span per key part, with no server (none was asked), in the round
/// of the part's last push.
pub(crate) fn held(rec: &Recorder, items: &[Item], started: Instant, ok: bool) {
    let now = Instant::now();
    rec.record_all(items.iter().flat_map(|it| {
        let info = &it.info;
        it.parts().filter_map(move |part| {
            let slice = info.slices.get(part)?;
            let counted = info.rounds.get(part)?.load(Ordering::Acquire);
            let bytes = u64::try_from(slice.len * info.unit() * info.dtype.size_of()).unwrap_or(u64::MAX);
            Some(
                Span::new(Op::Pull, started, now)
                    .key(&info.label, slice.offset as u64)
                    .bytes(bytes)
                    .round(counted.saturating_sub(1))
                    .ok(ok),
            )
        })
    }));
}

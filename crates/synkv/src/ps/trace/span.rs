//! [`Span`]: one recorded operation — what ([`Op`]), when (nanoseconds since the process's
//! trace epoch, [`Clock`]), on which key part, with which peer, how many bytes, in which
//! round — and the clock that turns `Instant`s into those numbers.
//!
//! A span holds no heap data of its own: the key's name is an `Arc<str>` shared with the
//! key's registration, so recording one costs a reference-count increment.

use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// What a span records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Worker: a key part pushed to a server, sent to answered. Server: a worker's push of
    /// an entry, arrival in the core to placed (including a sum and update it completed).
    Push,
    /// Worker: a key part pulled from a server. Server: a pull of an entry answered.
    Pull,
    /// Worker: a key part pushed and the updated value pulled back in one request.
    PushPull,
    /// Worker: the requested rows of a row_sparse key part pulled.
    RowSparsePull,
    /// Worker: a key's values summed over devices, copied or quantized, and cut into parts.
    Partition,
    /// Server: the pushes of a sync round summed (or folded into the accumulator).
    Sum,
    /// Server: the updater (optimizer) applied to a round's sum, or an async push applied.
    Update,
    /// A barrier: worker, from request to release; scheduler, from first arrival to release.
    Barrier,
    /// Scheduler: a node registered (instant).
    Register,
    /// A node was declared dead (instant; `label` names it).
    NodeDead,
    /// A dead server's partitions moved to their backups (instant).
    Failover,
    /// A dead worker left the job until a restart takes its rank (instant).
    WorkerAway,
    /// Why the flight recorder was dumped (instant; `label` says why).
    Failure,
}

impl Op {
    /// The event's name in the trace.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Push => "push",
            Op::Pull => "pull",
            Op::PushPull => "pushpull",
            Op::RowSparsePull => "row_sparse_pull",
            Op::Partition => "partition",
            Op::Sum => "sum",
            Op::Update => "update",
            Op::Barrier => "barrier",
            Op::Register => "register",
            Op::NodeDead => "node dead",
            Op::Failover => "failover",
            Op::WorkerAway => "worker away",
            Op::Failure => "failure",
        }
    }

    /// The event's category: `net` (a request and its answer), `compute` (summing, slicing,
    /// updating) or `control` (membership, barriers, failures).
    pub(crate) fn category(self) -> &'static str {
        match self {
            Op::Push | Op::Pull | Op::PushPull | Op::RowSparsePull => "net",
            Op::Partition | Op::Sum | Op::Update => "compute",
            _ => "control",
        }
    }

    /// Whether the event is an instant (no duration).
    pub(crate) fn is_instant(self) -> bool {
        matches!(self, Op::Register | Op::NodeDead | Op::Failover | Op::WorkerAway | Op::Failure)
    }

    /// Whether the span is about a key part (it goes on that part's track, and `label` is
    /// the key's name).
    pub(crate) fn on_key(self) -> bool {
        self.category() != "control"
    }
}

/// One recorded operation.
#[derive(Clone, Debug)]
pub(crate) struct Span {
    pub(crate) op: Op,
    /// Start, in nanoseconds since the trace epoch ([`Clock`]).
    pub(crate) start: u64,
    /// Duration in nanoseconds (0 for an instant).
    pub(crate) dur: u64,
    /// The key's name (key ops), or what a control event is about.
    pub(crate) label: Option<Arc<str>>,
    /// The key part's offset within the key, in elements (rows for row_sparse keys).
    pub(crate) offset: u64,
    /// The other side: a worker's server rank, a server's worker rank.
    pub(crate) peer: Option<u32>,
    /// Value bytes moved or processed.
    pub(crate) bytes: u64,
    /// The key part's round (see the module docs of `ps::trace`).
    pub(crate) round: Option<u64>,
    /// Whether it succeeded.
    pub(crate) ok: bool,
}

impl Span {
    /// A span of `op` from `start` to `end`.
    pub(crate) fn new(op: Op, start: Instant, end: Instant) -> Span {
        let clock = Clock::get();
        let start = clock.since_epoch(start);
        let dur = clock.since_epoch(end).saturating_sub(start);
        Span { op, start, dur, label: None, offset: 0, peer: None, bytes: 0, round: None, ok: true }
    }

    /// An instant event of `op` now, about `what`.
    pub(crate) fn instant(op: Op, what: impl Into<Arc<str>>) -> Span {
        let now = Instant::now();
        Span { label: Some(what.into()), ..Span::new(op, now, now) }
    }

    /// About key `label`'s part at `offset`.
    pub(crate) fn key(mut self, label: &Arc<str>, offset: u64) -> Span {
        self.label = Some(Arc::clone(label));
        self.offset = offset;
        self
    }

    /// With the peer's rank.
    pub(crate) fn peer(mut self, rank: u32) -> Span {
        self.peer = Some(rank);
        self
    }

    /// With `bytes` of values.
    pub(crate) fn bytes(mut self, bytes: u64) -> Span {
        self.bytes = bytes;
        self
    }

    /// In round `round`.
    pub(crate) fn round(mut self, round: u64) -> Span {
        self.round = Some(round);
        self
    }

    /// Marked as failed when `ok` is false.
    pub(crate) fn ok(mut self, ok: bool) -> Span {
        self.ok = ok;
        self
    }
}

/// The process's trace epoch: an `Instant` and the wall-clock time it was taken, so span
/// times are monotonic within a process and line up across processes (to the precision of
/// their clocks' agreement).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    epoch: Instant,
    /// Nanoseconds since the Unix epoch at `epoch`.
    unix_ns: u128,
}

static CLOCK: OnceLock<Clock> = OnceLock::new();

impl Clock {
    /// The process's clock (its epoch is the first call).
    pub(crate) fn get() -> Clock {
        *CLOCK.get_or_init(|| Clock {
            epoch: Instant::now(),
            unix_ns: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
        })
    }

    /// `t` in nanoseconds since the epoch (0 for an earlier instant).
    pub(crate) fn since_epoch(self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A span time (nanoseconds since the epoch) in microseconds since the Unix epoch, the
    /// unit of Chrome's `ts`.
    pub(crate) fn unix_micros(self, ns: u64) -> f64 {
        let total = self.unix_ns + u128::from(ns);
        // Whole microseconds are exact in an f64 until the year 2255; the fraction keeps
        // what precision remains.
        (total / 1000) as f64 + (total % 1000) as f64 / 1000.0
    }

    /// Nanoseconds since the epoch, now.
    pub(crate) fn now(self) -> u64 {
        self.since_epoch(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn spans_measure_from_the_epoch_and_instants_have_no_duration() {
        let clock = Clock::get();
        let t0 = Instant::now();
        let s = Span::new(Op::Push, t0, t0 + Duration::from_micros(1500)).peer(2).bytes(64).round(7).ok(false);
        assert_eq!(s.dur, 1_500_000);
        assert!(s.start <= clock.now());
        assert_eq!((s.peer, s.bytes, s.round, s.ok), (Some(2), 64, Some(7), false));
        let i = Span::instant(Op::NodeDead, "server rank 0");
        assert_eq!(i.dur, 0);
        assert!(i.op.is_instant() && !i.op.on_key());
        assert_eq!(i.label.as_deref(), Some("server rank 0"));
        let backwards = Span::new(Op::Pull, t0 + Duration::from_millis(1), t0);
        assert_eq!(backwards.dur, 0, "an end before the start is a zero-length span");
    }

    #[test]
    fn unix_micros_are_wall_clock_microseconds() {
        // .75 µs is exact in an f64 of this size (its resolution is 0.25 µs).
        let clock = Clock { epoch: Instant::now(), unix_ns: 1_700_000_000_123_456_750 };
        let whole = 1_700_000_000_123_456_f64;
        assert_eq!(clock.unix_micros(0), whole + 0.75);
        assert_eq!(clock.unix_micros(1_000), whole + 1.75);
        assert_eq!(clock.unix_micros(1), whole + 0.75, "sub-resolution fractions round");
    }
}

//! Trace timelines and the flight recorder of every role (`docs/tracing.md`).
//!
//! Each role of a process (worker, server, scheduler) records [`Span`]s of its operations:
//! on a worker, every key part pushed, pulled or push-pulled (send to answer) and the
//! partitioning of each pushed key; on a server, every push of an entry, the sum and the
//! update of every round, every pull answered; barriers and membership events on all.
//! Spans go into two bounded rings per role:
//!
//! - **the trace** (`SYNKV_TRACE_DIR`): the spans of the rounds in `SYNKV_TRACE_ROUNDS`, at
//!   most `SYNKV_TRACE_EVENTS` (the newest are kept), written as Chrome trace JSON
//!   (`chrome.rs`) to `DIR/synkv-<role>-<rank>-<pid>.json` when the role ends ([`finish`]:
//!   a server or the scheduler stopping, a worker's store closing);
//! - **the flight recorder** (always on unless `SYNKV_FLIGHT_RECORDER=0`): the last 256
//!   spans (`SYNKV_FLIGHT_RECORDER=N`), dumped when the role hits a timeout or learns that
//!   a peer died ([`dump`], [`dump_error`]): one log line per operation (`flight.rs`), and
//!   with `SYNKV_TRACE_DIR` also `DIR/synkv-<role>-<rank>-<pid>-flight.json`.
//!
//! **Rounds.** A span's round is the key part's round id, which the worker store already
//! counts: a worker's `r`-th push of a part (from 0) is round `r`, and so are the server's
//! sum and update of that round and every pull that reads its result (a pull before any push
//! counts as round 0). In a training loop that pushes every key once per step, round = step.
//! Spans with no round (barriers, membership) are always kept.
//!
//! **Cost.** Recording is a relaxed atomic load when both rings are off; otherwise two
//! `Instant::now()` calls and a short uncontended lock per key part, with no allocation
//! (a key's name is shared by reference count). Files are written off the hot path.
//!
//! Like `metrics`, the recorders are `static` (one per role of the process): the hook
//! points sit deep in the worker's engine callbacks and the server's state machine, and the
//! settings come from [`Config`](crate::ps::Config) through [`start`]. Several instances of
//! one role in one process (in-process tests) share a recorder.

mod chrome;
mod flight;
mod ring;
mod span;

pub(crate) use span::{Op, Span};

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use self::chrome::Header;
use self::ring::Ring;
use self::span::Clock;
use crate::ps::{Error, Role};

/// Default `SYNKV_FLIGHT_RECORDER`: operations kept per role.
pub const DEFAULT_FLIGHT_OPS: usize = 256;
/// Default `SYNKV_TRACE_EVENTS`: spans a trace keeps per role (about 80 bytes each).
pub const DEFAULT_TRACE_EVENTS: usize = 500_000;
/// Flight-recorder dumps per role and process at most (one per dead peer or timeout).
const MAX_DUMPS: usize = 8;

/// The rounds a trace records (`SYNKV_TRACE_ROUNDS=START:END`): `start <= round < end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rounds {
    /// The first round recorded.
    pub start: u64,
    /// The first round no longer recorded; `None` = no end.
    pub end: Option<u64>,
}

impl Rounds {
    /// Every round.
    pub const ALL: Rounds = Rounds { start: 0, end: None };

    /// Whether `round` is recorded.
    pub fn contains(&self, round: u64) -> bool {
        round >= self.start && self.end.is_none_or(|e| round < e)
    }

    /// Parses `START:END`, `START:` or `:END` (decimal; `START < END`).
    pub fn parse(text: &str) -> Option<Rounds> {
        let (a, b) = text.trim().split_once(':')?;
        let num = |s: &str| if s.trim().is_empty() { Ok(None) } else { s.trim().parse::<u64>().map(Some) };
        let (start, end) = (num(a).ok()?, num(b).ok()?);
        let r = Rounds { start: start.unwrap_or(0), end };
        (r.end.is_none_or(|e| e > r.start)).then_some(r)
    }
}

impl fmt::Display for Rounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.end {
            _ if *self == Rounds::ALL => f.write_str("all"),
            Some(end) => write!(f, "{}:{end}", self.start),
            None => write!(f, "{}:", self.start),
        }
    }
}

/// The trace and flight-recorder settings (`SYNKV_TRACE_*`, `SYNKV_FLIGHT_RECORDER`; read by
/// [`Config`](crate::ps::Config), table in `docs/dist-env.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `SYNKV_TRACE_DIR`: where trace files (and flight-recorder dumps) are written; `None` =
    /// no trace (dumps go to the log only).
    pub dir: Option<PathBuf>,
    /// `SYNKV_TRACE_ROUNDS`: the rounds the trace records.
    pub rounds: Rounds,
    /// `SYNKV_TRACE_EVENTS`: spans the trace keeps per role (the newest).
    pub events: usize,
    /// `SYNKV_FLIGHT_RECORDER`: operations the flight recorder keeps per role; 0 = off.
    pub flight: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings { dir: None, rounds: Rounds::ALL, events: DEFAULT_TRACE_EVENTS, flight: DEFAULT_FLIGHT_OPS }
    }
}

/// One role's recorder.
#[derive(Debug)]
pub(crate) struct Recorder {
    /// Whether anything is recorded (a trace or a flight recorder is on).
    on: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    rank: u32,
    dir: Option<PathBuf>,
    rounds: Rounds,
    /// Whether the trace records (`SYNKV_TRACE_DIR` set).
    tracing: bool,
    trace: Ring<Span>,
    flight: Ring<Span>,
    /// What dumps were made for (one per dead peer or timeout).
    dumps: Vec<String>,
}

impl Recorder {
    const fn new() -> Recorder {
        Recorder {
            on: AtomicBool::new(false),
            state: parking_lot::const_mutex(State {
                rank: 0,
                dir: None,
                rounds: Rounds::ALL,
                tracing: false,
                trace: Ring::empty(),
                flight: Ring::empty(),
                dumps: Vec::new(),
            }),
        }
    }

    /// Whether spans are recorded: check it before taking times, so recording costs nothing
    /// when it is off.
    #[inline]
    pub(crate) fn enabled(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Records one span.
    pub(crate) fn record(&self, span: Span) {
        self.record_all(std::iter::once(span));
    }

    /// Records spans under one lock.
    pub(crate) fn record_all(&self, spans: impl IntoIterator<Item = Span>) {
        if !self.enabled() {
            return;
        }
        let mut st = self.state.lock();
        for span in spans {
            if st.tracing && span.round.is_none_or(|r| st.rounds.contains(r)) {
                st.trace.push(span.clone());
            }
            st.flight.push(span);
        }
    }
}

static RECORDERS: [Recorder; 3] = [Recorder::new(), Recorder::new(), Recorder::new()];

/// The recorder of `role` in this process.
pub(crate) fn recorder(role: Role) -> &'static Recorder {
    &RECORDERS[match role {
        Role::Scheduler => 0,
        Role::Server => 1,
        Role::Worker => 2,
    }]
}

/// Starts recording for `role` (of rank `rank`) with `settings`. Called by each role once it
/// knows its rank; starting again (another instance in the same process) keeps what was
/// recorded unless the ring sizes change.
pub(crate) fn start(role: Role, rank: u32, settings: &Settings) {
    start_recorder(recorder(role), role, rank, settings);
}

fn start_recorder(rec: &Recorder, role: Role, rank: u32, settings: &Settings) {
    let clock = Clock::get(); // fixes the epoch before the first span
    let mut st = rec.state.lock();
    st.rank = rank;
    st.dir.clone_from(&settings.dir);
    st.rounds = settings.rounds;
    st.tracing = settings.dir.is_some() && settings.events > 0;
    let trace_cap = if st.tracing { settings.events } else { 0 };
    if st.trace.capacity() != trace_cap {
        st.trace = Ring::with_capacity(trace_cap, trace_cap.min(4096));
    }
    if st.flight.capacity() != settings.flight {
        st.flight = Ring::with_capacity(settings.flight, settings.flight);
    }
    let on = st.tracing || settings.flight > 0;
    drop(st);
    rec.on.store(on, Ordering::Relaxed);
    if let Some(dir) = settings.dir.as_deref() {
        tracing::info!(
            "trace of {} rounds {} into {} (epoch {:.0} µs)",
            chrome::process_name(role, rank),
            settings.rounds,
            dir.display(),
            clock.unix_micros(0)
        );
    }
}

/// The file a role writes into `dir` (`suffix`: `""` or `"-flight"`).
fn file_name(dir: &Path, role: Role, rank: u32, suffix: &str) -> PathBuf {
    dir.join(format!("synkv-{}-{rank}-{}{suffix}.json", role.as_str(), std::process::id()))
}

/// Writes `spans` to `path` as a Chrome trace (a temporary file renamed into place, so a
/// reader never sees half a file).
fn write_file(path: &Path, spans: &[&Span], header: &Header<'_>) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("json.tmp");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    chrome::write(&mut out, spans, Clock::get(), header)?;
    std::io::Write::flush(&mut out)?;
    drop(out);
    std::fs::rename(&tmp, path)
}

/// Writes `role`'s trace to `SYNKV_TRACE_DIR` (if set) and empties it; returns the file.
/// Called when the role ends. A failure to write is logged, never an error of the job.
pub(crate) fn finish(role: Role) -> Option<PathBuf> {
    finish_recorder(recorder(role), role)
}

fn finish_recorder(rec: &Recorder, role: Role) -> Option<PathBuf> {
    let mut st = rec.state.lock();
    let dir = st.dir.clone().filter(|_| st.tracing)?;
    let path = file_name(&dir, role, st.rank, "");
    let spans: Vec<&Span> = st.trace.iter().collect();
    let rounds = st.rounds.to_string();
    let header = Header { role, rank: st.rank, os_pid: std::process::id(), rounds: &rounds, dropped: st.trace.dropped(), reason: None };
    let written = write_file(&path, &spans, &header);
    let n = spans.len();
    drop(spans);
    st.trace.clear();
    drop(st);
    match written {
        Ok(()) => {
            tracing::info!("trace: wrote {n} spans to {}", path.display());
            Some(path)
        }
        Err(e) => {
            tracing::warn!("trace: could not write {}: {e} (check SYNKV_TRACE_DIR)", path.display());
            None
        }
    }
}

/// Dumps `role`'s flight recorder because of `reason` — to the log, one line per operation,
/// and with `SYNKV_TRACE_DIR` to `DIR/synkv-<role>-<rank>-<pid>-flight.json` — unless a dump
/// was made for the same `cause` already (a dead node is reported by several paths).
pub(crate) fn dump(role: Role, cause: &str, reason: &str) {
    dump_recorder(recorder(role), role, cause, reason);
}

fn dump_recorder(rec: &Recorder, role: Role, cause: &str, reason: &str) {
    if !rec.enabled() {
        return;
    }
    let mut st = rec.state.lock();
    if st.flight.capacity() == 0 || st.dumps.len() >= MAX_DUMPS || st.dumps.iter().any(|c| c == cause) {
        return;
    }
    st.dumps.push(cause.to_owned());
    let failure = Span::instant(Op::Failure, reason);
    if st.tracing {
        st.trace.push(failure.clone());
    }
    let me = chrome::process_name(role, st.rank);
    let peer_role = if role == Role::Server { "worker" } else { "server" };
    let lines = flight::lines(st.flight.iter(), Clock::get(), peer_role);
    let older = st.flight.dropped();
    let file = st.dir.as_ref().map(|dir| {
        let path = file_name(dir, role, st.rank, "-flight");
        let mut spans: Vec<&Span> = st.flight.iter().collect();
        spans.push(&failure);
        let header = Header { role, rank: st.rank, os_pid: std::process::id(), rounds: "all", dropped: older, reason: Some(reason) };
        let written = write_file(&path, &spans, &header);
        (path, written)
    });
    drop(st);
    tracing::error!(
        "flight recorder of {me}: its last {} operations, oldest first ({older} older ones not kept), because {reason}",
        lines.len()
    );
    for l in &lines {
        tracing::warn!("flight recorder of {me}: {l}");
    }
    match file {
        Some((path, Ok(()))) => tracing::error!("flight recorder of {me}: written to {}", path.display()),
        Some((path, Err(e))) => tracing::warn!("flight recorder of {me}: could not write {}: {e}", path.display()),
        None => {}
    }
}

/// Dumps `role`'s flight recorder if `e` is a timeout or a lost peer.
pub(crate) fn dump_error(role: Role, e: &Error) {
    match e {
        Error::LostPeer { node, .. } => dump(role, &lost_cause(node), &e.to_string()),
        Error::Timeout { .. } => dump(role, "timeout", &e.to_string()),
        _ => {}
    }
}

/// The dump cause of a lost node: its role and rank (the same whatever path reports it).
pub(crate) fn lost_cause(node: &crate::ps::Node) -> String {
    match node.rank {
        Some(rank) => format!("lost {} {rank}", node.role),
        None => format!("lost {}", node.role),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn rounds_parse_as_half_open_windows() {
        assert_eq!(Rounds::parse("10:20"), Some(Rounds { start: 10, end: Some(20) }));
        assert_eq!(Rounds::parse(" 5: "), Some(Rounds { start: 5, end: None }));
        assert_eq!(Rounds::parse(":3"), Some(Rounds { start: 0, end: Some(3) }));
        for bad in ["", "7", "3:3", "4:2", "a:b", "-1:2", "1:2:3"] {
            assert_eq!(Rounds::parse(bad), None, "{bad:?}");
        }
        let r = Rounds::parse("2:4").unwrap();
        assert!(!r.contains(1) && r.contains(2) && r.contains(3) && !r.contains(4));
        assert_eq!(
            (r.to_string(), Rounds::ALL.to_string(), Rounds { start: 5, end: None }.to_string()),
            ("2:4".into(), "all".into(), "5:".into())
        );
    }

    /// A recorder of its own (the statics are shared by every test of the process).
    fn fresh(settings: &Settings) -> Recorder {
        let rec = Recorder::new();
        start_recorder(&rec, Role::Worker, 0, settings);
        rec
    }

    #[test]
    fn the_trace_keeps_its_window_and_the_flight_recorder_the_last_ops() {
        let settings = Settings { dir: Some(PathBuf::from("unused")), rounds: Rounds { start: 2, end: Some(4) }, events: 100, flight: 3 };
        let rec = fresh(&settings);
        let k: Arc<str> = Arc::from("k");
        let t = Instant::now();
        rec.record_all((0..6).map(|r| Span::new(Op::Push, t, t).key(&k, 0).round(r)));
        rec.record(Span::new(Op::Barrier, t, t));
        let st = rec.state.lock();
        let trace: Vec<Option<u64>> = st.trace.iter().map(|s| s.round).collect();
        assert_eq!(trace, [Some(2), Some(3), None], "rounds 2 and 3, and the barrier (no round)");
        let flight: Vec<(Op, Option<u64>)> = st.flight.iter().map(|s| (s.op, s.round)).collect();
        assert_eq!(flight, [(Op::Push, Some(4)), (Op::Push, Some(5)), (Op::Barrier, None)]);
    }

    #[test]
    fn a_disabled_recorder_records_nothing() {
        let rec = Recorder::new();
        assert!(!rec.enabled());
        rec.record(Span::instant(Op::Failure, "x"));
        assert_eq!(rec.state.lock().flight.len(), 0);
    }

    #[test]
    fn finish_writes_a_chrome_trace_and_dump_writes_the_flight_recorder_once_per_cause() {
        let dir = std::env::temp_dir().join(format!("synkv-trace-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let settings = Settings { dir: Some(dir.clone()), ..Settings::default() };
        let rec = Recorder::new();
        start_recorder(&rec, Role::Scheduler, 0, &settings);
        let t = Instant::now();
        rec.record(Span::new(Op::Barrier, t, t));
        rec.record(Span::instant(Op::NodeDead, "server rank 0"));
        dump_recorder(&rec, Role::Scheduler, "lost server 0", "lost server rank 0: test");
        dump_recorder(&rec, Role::Scheduler, "lost server 0", "lost server rank 0: again");
        let flight = file_name(&dir, Role::Scheduler, 0, "-flight");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&flight).unwrap()).unwrap();
        assert_eq!(v["otherData"]["reason"], "lost server rank 0: test", "the second dump of the same cause is skipped");
        let names: Vec<&str> =
            v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] != "M").filter_map(|e| e["name"].as_str()).collect();
        assert_eq!(names, ["barrier", "node dead", "failure"]);
        let path = finish_recorder(&rec, Role::Scheduler).expect("a trace file");
        assert_eq!(path, file_name(&dir, Role::Scheduler, 0, ""));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] != "M").count(), 3);
        assert_eq!(rec.state.lock().trace.len(), 0, "written traces are emptied");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Spans as a Chrome Trace Event Format file (the JSON object form), which Perfetto
//! (<https://ui.perfetto.dev>) and `chrome://tracing` open.
//!
//! Layout: `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`. Every span
//! is a complete event (`"ph": "X"`, `ts` and `dur` in microseconds) or, for an instant, an
//! `"ph": "i"` event of process scope. `ts` is wall-clock time (microseconds since the Unix
//! epoch), so the files of several processes line up when loaded together. Metadata events
//! (`"ph": "M"`) name the process (`worker 1`, `server 0`, `scheduler`) and its tracks.
//!
//! **Tracks.** One track (`tid`) per key part, named `key NAME` (`key NAME @OFFSET` for a
//! part past the first), in the order of the names; track 1, `control`, holds barriers and
//! membership events. Tracks are assigned when the file is written, so recording a span
//! never looks anything up.
//!
//! **Processes.** `pid` is derived from the node, not the OS process, so one OS process
//! hosting several roles (a worker hosting a server) shows them apart, and so the ids are
//! unique within a job: 1 for the scheduler, 100000 + rank for a server, 200000 + rank for a
//! worker. The OS process id is in the process's label and the file name.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{self, Write};

use super::span::{Clock, Span};
use crate::ps::Role;

/// The track of control events.
const CONTROL_TID: u32 = 1;
/// The first key-part track.
const FIRST_KEY_TID: u32 = 10;

/// What a file says about the process that wrote it.
#[derive(Debug)]
pub(crate) struct Header<'a> {
    pub(crate) role: Role,
    pub(crate) rank: u32,
    pub(crate) os_pid: u32,
    /// `SYNKV_TRACE_ROUNDS` as given (or `all`).
    pub(crate) rounds: &'a str,
    /// Spans recorded but no longer kept (the ring was full).
    pub(crate) dropped: u64,
    /// For a flight-recorder dump: why it was written.
    pub(crate) reason: Option<&'a str>,
}

/// The trace `pid` of a node (see the module docs).
pub(crate) fn trace_pid(role: Role, rank: u32) -> u32 {
    match role {
        Role::Scheduler => 1,
        Role::Server => 100_000 + rank,
        Role::Worker => 200_000 + rank,
    }
}

/// The node's name in the trace.
pub(crate) fn process_name(role: Role, rank: u32) -> String {
    match role {
        Role::Scheduler => "scheduler".to_owned(),
        other => format!("{other} {rank}"),
    }
}

#[derive(Serialize)]
struct Args<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    offset: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    worker: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    round: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    ok: bool,
}

#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    cat: &'a str,
    ph: &'a str,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    /// Scope of an instant event.
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'a str>,
    pid: u32,
    tid: u32,
    args: Args<'a>,
}

#[derive(Serialize)]
struct Meta<'a, A: Serialize> {
    name: &'a str,
    ph: &'a str,
    pid: u32,
    tid: u32,
    args: A,
}

#[derive(Serialize)]
struct Named<'a> {
    name: &'a str,
}

#[derive(Serialize)]
struct Sorted {
    sort_index: u32,
}

#[derive(Serialize)]
struct Labels<'a> {
    labels: &'a str,
}

#[derive(Serialize)]
struct OtherData<'a> {
    synkv: &'a str,
    role: &'a str,
    rank: u32,
    os_pid: u32,
    rounds: &'a str,
    spans: usize,
    dropped: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

/// Writes `spans` (in any order; written by start time) as one Chrome trace JSON object.
pub(crate) fn write(out: &mut impl Write, spans: &[&Span], clock: Clock, header: &Header<'_>) -> io::Result<()> {
    let pid = trace_pid(header.role, header.rank);
    let mut order: Vec<&Span> = spans.to_vec();
    order.sort_by_key(|s| (s.start, s.dur));
    // Tracks: one per key part, in name order.
    let mut tracks: BTreeMap<(&str, u64), u32> = BTreeMap::new();
    for s in order.iter().filter(|s| s.op.on_key()) {
        tracks.insert((s.label.as_deref().unwrap_or(""), s.offset), 0);
    }
    for (n, tid) in tracks.values_mut().enumerate() {
        *tid = FIRST_KEY_TID + u32::try_from(n).unwrap_or(u32::MAX - FIRST_KEY_TID);
    }

    out.write_all(b"{\"traceEvents\":[\n")?;
    let name = process_name(header.role, header.rank);
    let sort = match header.role {
        Role::Scheduler => 0,
        Role::Server => 1 + header.rank,
        Role::Worker => 100_000 + header.rank,
    };
    let label = format!("pid {}", header.os_pid);
    let mut first = true;
    let mut emit = |out: &mut dyn Write, v: &dyn erased::Json| -> io::Result<()> {
        if !first {
            out.write_all(b",\n")?;
        }
        first = false;
        v.write_to(out)
    };
    emit(out, &Meta { name: "process_name", ph: "M", pid, tid: 0, args: Named { name: &name } })?;
    emit(out, &Meta { name: "process_sort_index", ph: "M", pid, tid: 0, args: Sorted { sort_index: sort } })?;
    emit(out, &Meta { name: "process_labels", ph: "M", pid, tid: 0, args: Labels { labels: &label } })?;
    emit(out, &Meta { name: "thread_name", ph: "M", pid, tid: CONTROL_TID, args: Named { name: "control" } })?;
    emit(out, &Meta { name: "thread_sort_index", ph: "M", pid, tid: CONTROL_TID, args: Sorted { sort_index: 0 } })?;
    for ((key, offset), tid) in &tracks {
        let track = if *offset == 0 { format!("key {key}") } else { format!("key {key} @{offset}") };
        emit(out, &Meta { name: "thread_name", ph: "M", pid, tid: *tid, args: Named { name: &track } })?;
        emit(out, &Meta { name: "thread_sort_index", ph: "M", pid, tid: *tid, args: Sorted { sort_index: *tid } })?;
    }
    let (peer_is_server, peer_is_worker) = (header.role == Role::Worker, header.role == Role::Server);
    for s in order {
        let on_key = s.op.on_key();
        let tid =
            if on_key { tracks.get(&(s.label.as_deref().unwrap_or(""), s.offset)).copied().unwrap_or(CONTROL_TID) } else { CONTROL_TID };
        let instant = s.op.is_instant();
        let ev = Event {
            name: s.op.name(),
            cat: s.op.category(),
            ph: if instant { "i" } else { "X" },
            ts: clock.unix_micros(s.start),
            dur: (!instant).then(|| s.dur as f64 / 1000.0),
            s: instant.then_some("p"),
            pid,
            tid,
            args: Args {
                key: if on_key { s.label.as_deref() } else { None },
                offset: on_key.then_some(s.offset),
                server: s.peer.filter(|_| peer_is_server),
                worker: s.peer.filter(|_| peer_is_worker),
                bytes: (s.bytes > 0).then_some(s.bytes),
                round: s.round,
                detail: if on_key { None } else { s.label.as_deref() },
                ok: s.ok,
            },
        };
        emit(out, &ev)?;
    }
    out.write_all(b"\n],\"displayTimeUnit\":\"ms\",\"otherData\":")?;
    let other = OtherData {
        synkv: env!("CARGO_PKG_VERSION"),
        role: header.role.as_str(),
        rank: header.rank,
        os_pid: header.os_pid,
        rounds: header.rounds,
        spans: spans.len(),
        dropped: header.dropped,
        reason: header.reason,
    };
    serde_json::to_writer(&mut *out, &other).map_err(io::Error::from)?;
    out.write_all(b"}\n")
}

/// Object-safe JSON writing for the heterogeneous events above.
mod erased {
    use std::io::{self, Write};

    pub(super) trait Json {
        fn write_to(&self, out: &mut dyn Write) -> io::Result<()>;
    }

    impl<T: serde::Serialize> Json for T {
        fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
            serde_json::to_writer(out, self).map_err(io::Error::from)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::trace::span::Op;
    use serde_json::Value;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn written(spans: &[Span], role: Role) -> Value {
        let refs: Vec<&Span> = spans.iter().collect();
        let mut out = Vec::new();
        let header = Header { role, rank: 1, os_pid: 4242, rounds: "all", dropped: 3, reason: None };
        write(&mut out, &refs, Clock::get(), &header).unwrap();
        serde_json::from_slice(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out)))
    }

    #[test]
    fn spans_become_complete_events_on_one_track_per_key_part_with_named_process_and_tracks() {
        let t0 = Instant::now();
        let x: Arc<str> = Arc::from("x");
        let w: Arc<str> = Arc::from("w \"quoted\"");
        let ms = Duration::from_millis(1);
        let spans = vec![
            Span::new(Op::Pull, t0 + 3 * ms, t0 + 4 * ms).key(&x, 0).peer(0).bytes(16).round(0),
            Span::new(Op::Push, t0, t0 + 2 * ms).key(&x, 0).peer(0).bytes(16).round(0),
            Span::new(Op::Push, t0, t0 + ms).key(&w, 512).peer(1).bytes(8).round(0).ok(false),
            Span::instant(Op::NodeDead, "server rank 1"),
        ];
        let v = written(&spans, Role::Worker);
        assert_eq!(v["displayTimeUnit"], "ms");
        assert_eq!(v["otherData"]["dropped"], 3);
        let events = v["traceEvents"].as_array().expect("an array");
        let pid = trace_pid(Role::Worker, 1);
        let meta = |name: &str, tid: u64| {
            events.iter().find(|e| e["ph"] == "M" && e["name"] == name && e["tid"] == tid).unwrap_or_else(|| panic!("no {name} {tid}"))
        };
        assert_eq!(meta("process_name", 0)["args"]["name"], "worker 1");
        assert_eq!(meta("process_labels", 0)["args"]["labels"], "pid 4242");
        // Tracks in name order: `w "quoted"` @512, then x.
        assert_eq!(meta("thread_name", 10)["args"]["name"], "key w \"quoted\" @512");
        assert_eq!(meta("thread_name", 11)["args"]["name"], "key x");
        let x_events: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X" && e["tid"] == 11).collect();
        assert_eq!(x_events.len(), 2);
        assert_eq!((x_events[0]["name"].as_str(), x_events[1]["name"].as_str()), (Some("push"), Some("pull")), "sorted by start");
        for e in &x_events {
            assert_eq!(e["pid"], pid);
            assert_eq!(e["cat"], "net");
            assert_eq!(e["args"]["key"], "x");
            assert_eq!(e["args"]["server"], 0);
            assert!(e["args"].get("worker").is_none());
            assert!(e["ts"].as_f64().unwrap() > 1.5e15, "wall-clock microseconds");
        }
        assert_eq!(x_events[0]["dur"].as_f64(), Some(2000.0));
        assert!(x_events[1]["ts"].as_f64().unwrap() - x_events[0]["ts"].as_f64().unwrap() >= 2999.0);
        let failed = events.iter().find(|e| e["tid"] == 10 && e["ph"] == "X").unwrap();
        assert_eq!(failed["args"]["ok"], false);
        let dead = events.iter().find(|e| e["ph"] == "i").unwrap();
        assert_eq!((dead["name"].as_str(), dead["s"].as_str(), dead["tid"].as_u64()), (Some("node dead"), Some("p"), Some(1)));
        assert_eq!(dead["args"]["detail"], "server rank 1");
        assert!(dead.get("dur").is_none());
    }

    #[test]
    fn a_server_names_its_peers_workers_and_an_empty_trace_is_valid() {
        let t0 = Instant::now();
        let k: Arc<str> = Arc::from("3");
        let v = written(&[Span::new(Op::Sum, t0, t0).key(&k, 0).peer(2)], Role::Server);
        let ev = v["traceEvents"].as_array().unwrap().iter().find(|e| e["ph"] == "X").unwrap();
        assert_eq!(ev["args"]["worker"], 2);
        assert_eq!(ev["pid"], trace_pid(Role::Server, 1));
        let empty = written(&[], Role::Scheduler);
        assert_eq!(empty["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] != "M").count(), 0);
        assert_eq!(empty["traceEvents"][0]["args"]["name"], "scheduler");
    }
}

//! Prometheus metrics of every role (`SYNKV_METRICS_ADDR`): counters, gauges and histograms
//! kept in process-wide atomics, rendered in the Prometheus text format (version 0.0.4) by a
//! small HTTP endpoint (`http.rs`).
//!
//! One process has one endpoint however many roles it runs (a worker hosting the scheduler
//! and a server, `store::distributed::hosted`): each role's series carry a `role` label, and
//! only the roles started in this process are rendered. Several instances of one role in one
//! process (in-process tests) add into the same series.
//!
//! Deliberately not here: a metrics client library. Recording is a relaxed atomic add or
//! store (no lock, no allocation per operation); rendering allocates one `String` per
//! scrape. The registry is a `static` (unlike the rest of `ps`, which passes values down):
//! the hook points sit deep in the worker's engine callbacks and the server's state machine,
//! and threading a handle through them all would touch every constructor for no gain —
//! metrics never change behaviour.
//!
//! Main items: [`start`] (the endpoint, from the environment), [`render`] (the text).

mod http;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use http::MetricsError;

use crate::ps::Role;

/// Histogram bucket upper bounds, in nanoseconds (50 µs … 60 s).
const BOUNDS_NS: [u64; 17] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    5_000_000_000,
    10_000_000_000,
    60_000_000_000,
];

/// A monotonically increasing count.
#[derive(Debug)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug)]
pub(crate) struct Gauge(AtomicI64);

impl Gauge {
    const fn new() -> Gauge {
        Gauge(AtomicI64::new(0))
    }

    pub(crate) fn add(&self, n: i64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn set(&self, n: i64) {
        self.0.store(n, Ordering::Relaxed);
    }

    fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Durations in fixed buckets ([`BOUNDS_NS`]); counts are per bucket and summed when rendered.
#[derive(Debug)]
pub(crate) struct Histogram {
    buckets: [AtomicU64; BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    const fn new() -> Histogram {
        Histogram { buckets: [const { AtomicU64::new(0) }; BOUNDS_NS.len() + 1], sum_ns: AtomicU64::new(0) }
    }

    pub(crate) fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = BOUNDS_NS.partition_point(|&b| b < ns);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// A worker's series (role `worker`).
#[derive(Debug)]
pub(crate) struct WorkerMetrics {
    active: AtomicBool,
    /// Value bytes sent by push and pushpull requests.
    pub(crate) push_bytes: Counter,
    /// Value bytes received in pull, pushpull and row_sparse_pull replies.
    pub(crate) pull_bytes: Counter,
    /// Latency of one store operation, by op: push, pull, pushpull, row_sparse_pull.
    pub(crate) latency: [Histogram; 4],
    /// Store operations sent to the servers and not yet answered.
    pub(crate) in_flight: Gauge,
    /// Operations that failed.
    pub(crate) failures: Counter,
    /// Pulls answered from the values their keys' last pushes were answered with, without a
    /// message (`store::distributed::held`).
    pub(crate) pulls_held: Counter,
    /// Unix time (milliseconds) of the last push or pushpull completion.
    pub(crate) last_step_ms: AtomicU64,
}

/// The ops of [`WorkerMetrics::latency`], in order.
pub(crate) const WORKER_OPS: [&str; 4] = ["push", "pull", "pushpull", "row_sparse_pull"];

impl WorkerMetrics {
    /// Records the completion of a push or pushpull now.
    pub(crate) fn stepped(&self) {
        let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.last_step_ms.store(ms, Ordering::Relaxed);
    }
}

/// A server's series (role `server`).
#[derive(Debug)]
pub(crate) struct ServerMetrics {
    active: AtomicBool,
    /// Value bytes received in requests.
    pub(crate) received_bytes: Counter,
    /// Value bytes sent in replies.
    pub(crate) sent_bytes: Counter,
    /// Requests handled (data requests and commands).
    pub(crate) requests: Counter,
    /// Time the update of a completed sync round took (optimizer or assign).
    pub(crate) update: Histogram,
    /// Time a sync round waited from its first push to its last.
    pub(crate) round_wait: Histogram,
    /// Sync rounds whose updates ran beside others' on several threads (`partition/batch.rs`).
    pub(crate) parallel_rounds: Counter,
    /// Key parts held (every partition, primaries and backups).
    pub(crate) keys: Gauge,
    /// Straggler warnings (`SYNKV_STRAGGLER_WARN_MS`) given.
    pub(crate) stragglers: Counter,
    /// Events queued for the server's state machine.
    pub(crate) queue_depth: Gauge,
}

/// The scheduler's series (role `scheduler`).
#[derive(Debug)]
pub(crate) struct SchedulerMetrics {
    active: AtomicBool,
    /// Connected servers.
    pub(crate) live_servers: Gauge,
    /// Connected workers.
    pub(crate) live_workers: Gauge,
    /// Workers away (dead, restartable: `SYNKV_WORKER_RESTARTS`).
    pub(crate) workers_away: Gauge,
    /// Workers that finished.
    pub(crate) workers_finished: Gauge,
    /// Barriers released.
    pub(crate) barriers: Counter,
}

/// The transport's series (every role; no label).
#[derive(Debug)]
pub(crate) struct TransportMetrics {
    /// Chunk bytes this process sent through shared memory (`SYNKV_SHM`).
    pub(crate) shm_bytes: Counter,
    /// Data frames eligible for shared memory that found no room in the segment and went
    /// on the connection instead.
    pub(crate) shm_full: Counter,
    /// Answers sent through the broadcast segment (a value copied once for every local
    /// worker that pulls it).
    pub(crate) shm_broadcast: Counter,
    /// Answer bytes read from the socket straight into the outputs (`transport/landing.rs`).
    pub(crate) landed_bytes: Counter,
}

/// Every series of this process.
#[derive(Debug)]
pub(crate) struct Metrics {
    pub(crate) transport: TransportMetrics,
    pub(crate) worker: WorkerMetrics,
    pub(crate) server: ServerMetrics,
    pub(crate) scheduler: SchedulerMetrics,
}

/// The process's metrics.
pub(crate) static METRICS: Metrics = Metrics {
    transport: TransportMetrics {
        shm_bytes: Counter::new(),
        shm_full: Counter::new(),
        shm_broadcast: Counter::new(),
        landed_bytes: Counter::new(),
    },
    worker: WorkerMetrics {
        active: AtomicBool::new(false),
        push_bytes: Counter::new(),
        pull_bytes: Counter::new(),
        latency: [const { Histogram::new() }; 4],
        in_flight: Gauge::new(),
        failures: Counter::new(),
        pulls_held: Counter::new(),
        last_step_ms: AtomicU64::new(0),
    },
    server: ServerMetrics {
        active: AtomicBool::new(false),
        received_bytes: Counter::new(),
        sent_bytes: Counter::new(),
        requests: Counter::new(),
        update: Histogram::new(),
        round_wait: Histogram::new(),
        parallel_rounds: Counter::new(),
        keys: Gauge::new(),
        stragglers: Counter::new(),
        queue_depth: Gauge::new(),
    },
    scheduler: SchedulerMetrics {
        active: AtomicBool::new(false),
        live_servers: Gauge::new(),
        live_workers: Gauge::new(),
        workers_away: Gauge::new(),
        workers_finished: Gauge::new(),
        barriers: Counter::new(),
    },
};

/// The endpoint of this process, once started (or why it could not be).
static ENDPOINT: OnceLock<Option<SocketAddr>> = OnceLock::new();

/// Marks `role` as running in this process (its series are rendered from now on) and, the
/// first time any role calls it with `SYNKV_METRICS_ADDR` set, starts the endpoint. A bad
/// address or a port in use is logged and the role goes on without metrics: monitoring never
/// stops a job.
pub fn start(role: Role) -> Option<SocketAddr> {
    let active = match role {
        Role::Worker => &METRICS.worker.active,
        Role::Server => &METRICS.server.active,
        Role::Scheduler => &METRICS.scheduler.active,
    };
    active.store(true, Ordering::Relaxed);
    *ENDPOINT.get_or_init(|| {
        let spec = std::env::var("SYNKV_METRICS_ADDR").ok().filter(|s| !s.trim().is_empty())?;
        match http::spawn(&spec) {
            Ok(addr) => {
                tracing::info!("metrics on http://{addr}/metrics");
                if let Ok(file) = std::env::var("SYNKV_METRICS_FILE") {
                    if let Err(e) = http::record(&file, addr) {
                        tracing::warn!("metrics: could not append the endpoint to SYNKV_METRICS_FILE={file}: {e}");
                    }
                }
                Some(addr)
            }
            Err(e) => {
                tracing::warn!("{e}; this process runs without metrics");
                None
            }
        }
    })
}

/// The exposition text (Prometheus text format 0.0.4) of the roles running in this process.
pub fn render() -> String {
    let mut out = String::with_capacity(8 << 10);
    let m = &METRICS;
    family(&mut out, "synkv_up", "gauge", "1 while the process serves metrics.");
    let _ = writeln!(out, "synkv_up 1");
    let t = &m.transport;
    counter(&mut out, "synkv_shm_bytes_total", "Chunk bytes sent through shared memory (SYNKV_SHM).", "", t.shm_bytes.get());
    counter(
        &mut out,
        "synkv_shm_full_total",
        "Data frames that found no room in the shared-memory segment and went on the connection.",
        "",
        t.shm_full.get(),
    );
    counter(
        &mut out,
        "synkv_shm_broadcast_total",
        "Answers sent through the server's broadcast segment (one copy for every local worker).",
        "",
        t.shm_broadcast.get(),
    );
    counter(
        &mut out,
        "synkv_landed_bytes_total",
        "Answer bytes read from the socket straight into the outputs (no copy after the kernel's).",
        "",
        t.landed_bytes.get(),
    );
    if m.worker.active.load(Ordering::Relaxed) {
        let w = &m.worker;
        let l = "role=\"worker\"";
        counter(&mut out, "synkv_worker_push_bytes_total", "Value bytes sent by push and pushpull.", l, w.push_bytes.get());
        counter(
            &mut out,
            "synkv_worker_pull_bytes_total",
            "Value bytes received by pull, pushpull and row_sparse_pull.",
            l,
            w.pull_bytes.get(),
        );
        family(&mut out, "synkv_worker_request_seconds", "histogram", "Latency of one store operation, sent to answered by every server.");
        for (op, h) in WORKER_OPS.iter().zip(&w.latency) {
            histogram(&mut out, "synkv_worker_request_seconds", &format!("{l},op=\"{op}\""), h);
        }
        gauge(&mut out, "synkv_worker_requests_in_flight", "Store operations sent and not yet answered.", l, w.in_flight.get());
        counter(&mut out, "synkv_worker_request_failures_total", "Store operations that failed.", l, w.failures.get());
        counter(
            &mut out,
            "synkv_worker_pulls_held_total",
            "Pulls answered from the values sent back with their keys' last pushes, without a message.",
            l,
            w.pulls_held.get(),
        );
        let ms = w.last_step_ms.load(Ordering::Relaxed);
        family(
            &mut out,
            "synkv_worker_last_step_timestamp_seconds",
            "gauge",
            "Unix time of the last push or pushpull completion (0: none yet).",
        );
        let _ = writeln!(out, "synkv_worker_last_step_timestamp_seconds{{{l}}} {}.{:03}", ms / 1000, ms % 1000);
    }
    if m.server.active.load(Ordering::Relaxed) {
        let s = &m.server;
        let l = "role=\"server\"";
        counter(&mut out, "synkv_server_received_bytes_total", "Value bytes received in requests.", l, s.received_bytes.get());
        counter(&mut out, "synkv_server_sent_bytes_total", "Value bytes sent in replies.", l, s.sent_bytes.get());
        counter(&mut out, "synkv_server_requests_total", "Requests handled.", l, s.requests.get());
        family(
            &mut out,
            "synkv_server_update_seconds",
            "histogram",
            "Time the update (optimizer or assign) of a completed sync round took.",
        );
        histogram(&mut out, "synkv_server_update_seconds", l, &s.update);
        family(&mut out, "synkv_server_round_wait_seconds", "histogram", "Time a sync round waited from its first push to its last.");
        histogram(&mut out, "synkv_server_round_wait_seconds", l, &s.round_wait);
        counter(
            &mut out,
            "synkv_server_parallel_rounds_total",
            "Sync rounds updated beside others on several threads (a request that completed many keys' rounds).",
            l,
            s.parallel_rounds.get(),
        );
        gauge(&mut out, "synkv_server_keys", "Key parts held (primaries and backup copies).", l, s.keys.get());
        counter(&mut out, "synkv_server_stragglers_total", "Straggler warnings given (SYNKV_STRAGGLER_WARN_MS).", l, s.stragglers.get());
        gauge(&mut out, "synkv_server_queue_depth", "Events queued for the server's state machine.", l, s.queue_depth.get());
    }
    if m.scheduler.active.load(Ordering::Relaxed) {
        let c = &m.scheduler;
        family(&mut out, "synkv_scheduler_live_nodes", "gauge", "Connected nodes, by node role.");
        let _ = writeln!(out, "synkv_scheduler_live_nodes{{role=\"scheduler\",node_role=\"server\"}} {}", c.live_servers.get());
        let _ = writeln!(out, "synkv_scheduler_live_nodes{{role=\"scheduler\",node_role=\"worker\"}} {}", c.live_workers.get());
        let l = "role=\"scheduler\"";
        gauge(&mut out, "synkv_scheduler_workers_away", "Workers away (dead and restartable).", l, c.workers_away.get());
        gauge(&mut out, "synkv_scheduler_workers_finished", "Workers that finished.", l, c.workers_finished.get());
        counter(&mut out, "synkv_scheduler_barriers_total", "Barriers released.", l, c.barriers.get());
    }
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn counter(out: &mut String, name: &str, help: &str, labels: &str, v: u64) {
    family(out, name, "counter", help);
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {v}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {v}");
    }
}

fn gauge(out: &mut String, name: &str, help: &str, labels: &str, v: i64) {
    family(out, name, "gauge", help);
    let _ = writeln!(out, "{name}{{{labels}}} {v}");
}

fn histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    let mut cum = 0u64;
    for (i, bound) in BOUNDS_NS.iter().enumerate() {
        cum += h.buckets[i].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{}\"}} {cum}", seconds(*bound));
    }
    cum += h.buckets[BOUNDS_NS.len()].load(Ordering::Relaxed);
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cum}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", seconds(h.sum_ns.load(Ordering::Relaxed)));
    let _ = writeln!(out, "{name}_count{{{labels}}} {cum}");
}

/// Nanoseconds as decimal seconds, exactly (no float rounding).
fn seconds(ns: u64) -> String {
    let (s, frac) = (ns / 1_000_000_000, ns % 1_000_000_000);
    if frac == 0 {
        return s.to_string();
    }
    let f = format!("{frac:09}");
    format!("{s}.{}", f.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_exact_decimals() {
        assert_eq!(seconds(50_000), "0.00005");
        assert_eq!(seconds(2_500_000_000), "2.5");
        assert_eq!(seconds(60_000_000_000), "60");
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_sum_and_count() {
        let h = Histogram::new();
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(100));
        let mut out = String::new();
        histogram(&mut out, "x", "role=\"t\"", &h);
        assert!(out.contains("x_bucket{role=\"t\",le=\"0.00005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{role=\"t\",le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{role=\"t\",le=\"60\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{role=\"t\",le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count{role=\"t\"} 3\n"), "{out}");
        assert!(out.contains("x_sum{role=\"t\"} 100.00301\n"), "{out}");
    }
}

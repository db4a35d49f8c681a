//! `SYNKV_TRACE_DIR` and the flight recorder (issue 14 item 4). A real 2-worker × 1-server
//! job under `synkv launch` writes one trace per role; each must parse strictly as Chrome
//! Trace Event Format JSON, hold the push/pull spans of every key on the workers and the
//! sum/update spans on the server, and order them sensibly (a round's push before the pull
//! that reads it; a round's sum before its update). Then a server is killed with SIGKILL
//! during a job, and the survivors must dump their flight recorders (log lines and files).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::util::{launch, Job};

/// t24's keys (`selftest dist t24-opt`): small f32 and f16 keys and two big ones.
const KEYS: [&str; 8] = ["3", "5", "7", "99", "4", "6", "8", "100"];
/// Rounds the job runs (`--repeat`).
const ROUNDS: u64 = 3;
/// Slack when comparing one span's end (`ts + dur`) with another's start, in microseconds:
/// wall-clock `ts` values near 1.7e15 µs are f64s with a resolution of 0.25 µs.
const EPS: f64 = 1.0;

fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn unix_micros() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("a clock after 1970").as_micros() as f64
}

/// The files in `dir`, by name.
fn files(dir: &Path) -> BTreeMap<String, PathBuf> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .collect()
}

/// A trace file parsed strictly, with every event checked against the format: returns its
/// non-metadata events (checked to be ordered by `ts`) and its process name.
fn parse_trace(path: &Path, window: (f64, f64)) -> (Vec<Value>, String) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let top = v.as_object().unwrap_or_else(|| panic!("{}: not an object", path.display()));
    assert_eq!(top.get("displayTimeUnit").and_then(Value::as_str), Some("ms"), "{}", path.display());
    let events =
        top.get("traceEvents").and_then(Value::as_array).unwrap_or_else(|| panic!("{}: traceEvents is not an array", path.display()));
    let mut process = None;
    let mut out = Vec::new();
    let mut last_ts = f64::MIN;
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("{}: an event without ph: {e}", path.display()));
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{}: pid and tid are integers: {e}", path.display());
        assert!(e["name"].is_string(), "{}: {e}", path.display());
        match ph {
            "M" => {
                if e["name"] == "process_name" {
                    process = e["args"]["name"].as_str().map(str::to_owned);
                }
            }
            "X" | "i" => {
                assert!(e["cat"].is_string(), "{e}");
                let ts = e["ts"].as_f64().unwrap_or_else(|| panic!("ts is a number: {e}"));
                if ph == "X" {
                    let dur = e["dur"].as_f64().unwrap_or_else(|| panic!("dur is a number: {e}"));
                    assert!(dur >= 0.0, "{e}");
                    assert!(ts + dur <= window.1, "{}: ends after the job: {e}", path.display());
                } else {
                    assert_eq!(e["s"], "p", "{e}");
                }
                assert!(ts >= window.0 && ts <= window.1, "{}: ts {ts} outside the job's wall-clock window {window:?}", path.display());
                assert!(ts >= last_ts, "{}: events are ordered by ts", path.display());
                last_ts = ts;
                out.push(e.clone());
            }
            other => panic!("{}: unexpected ph {other:?}: {e}", path.display()),
        }
    }
    (out, process.unwrap_or_else(|| panic!("{}: no process_name", path.display())))
}

/// Spans named `name` by (key, offset, round).
fn by_part<'a>(events: &'a [Value], name: &str) -> BTreeMap<(String, u64, u64), Vec<&'a Value>> {
    let mut out: BTreeMap<_, Vec<&Value>> = BTreeMap::new();
    for e in events.iter().filter(|e| e["name"] == name && e["ph"] == "X") {
        let args = &e["args"];
        let key = args["key"].as_str().unwrap_or_else(|| panic!("{name} without a key: {e}")).to_owned();
        let offset = args["offset"].as_u64().unwrap_or_else(|| panic!("{name} without an offset: {e}"));
        let round = args["round"].as_u64().unwrap_or_else(|| panic!("{name} without a round: {e}"));
        assert_eq!(args["ok"], true, "{e}");
        out.entry((key, offset, round)).or_default().push(e);
    }
    out
}

fn end(e: &Value) -> f64 {
    e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap()
}

fn start(e: &Value) -> f64 {
    e["ts"].as_f64().unwrap()
}

#[test]
fn a_traced_job_writes_a_valid_chrome_trace_per_role() {
    let dir = fresh_dir("trace-job");
    let dir_s = dir.display().to_string();
    // Parts of 1 MiB: the big keys (1200×1200) are cut into several parts on the one server.
    let env = [("SYNKV_TRACE_DIR", dir_s.as_str()), ("SYNKV_PARTITION_BYTES", "1048576")];
    let before = unix_micros();
    let run = launch(2, 1, &[], &["t24-opt", "--repeat", &ROUNDS.to_string()], &env);
    let after = unix_micros();
    assert!(run.status.success(), "{}", run.output);
    assert!(!run.output.contains("flight recorder"), "a clean job dumps no flight recorder:\n{}", run.output);

    let found = files(&dir);
    let names: Vec<&str> = found.keys().map(String::as_str).collect();
    assert_eq!(found.len(), 4, "one trace per role: {names:?}");
    let mut processes = BTreeMap::new();
    for (name, path) in &found {
        assert!(name.starts_with("synkv-") && name.ends_with(".json") && !name.contains("-flight"), "{name}");
        let (events, process) = parse_trace(path, (before, after));
        let role_rank: Vec<&str> = name.trim_start_matches("synkv-").split('-').take(2).collect();
        let want = match role_rank[0] {
            "scheduler" => "scheduler".to_owned(),
            role => format!("{role} {}", role_rank[1]),
        };
        assert_eq!(process, want, "{name}");
        processes.insert(process, events);
    }
    let names: Vec<&String> = processes.keys().collect();
    assert_eq!(names, ["scheduler", "server 0", "worker 0", "worker 1"]);

    for worker in ["worker 0", "worker 1"] {
        let events = &processes[worker];
        let pushes = by_part(events, "push");
        let pulls = by_part(events, "pull");
        for key in KEYS {
            let parts: BTreeSet<u64> = pushes.keys().filter(|(k, _, _)| k == key).map(|(_, o, _)| *o).collect();
            assert!(!parts.is_empty(), "{worker}: no push span of key {key}");
            if key == "99" || key == "100" {
                assert!(parts.len() > 1, "{worker}: big key {key} travels in parts: {parts:?}");
            }
            for offset in &parts {
                for round in 0..ROUNDS {
                    let part = (key.to_owned(), *offset, round);
                    let push = pushes.get(&part).unwrap_or_else(|| panic!("{worker}: no push of {part:?}"));
                    let pull = pulls.get(&part).unwrap_or_else(|| panic!("{worker}: no pull of {part:?}"));
                    assert_eq!((push.len(), pull.len()), (1, 1), "{worker} {part:?}");
                    assert_eq!(push[0]["args"]["server"], 0, "{}", push[0]);
                    assert!(push[0]["args"]["bytes"].as_u64().unwrap_or(0) > 0, "{}", push[0]);
                    assert!(end(push[0]) <= start(pull[0]) + EPS, "{worker} {part:?}: the pull reads the push's round");
                }
            }
        }
        let partitions = by_part(events, "partition");
        assert!(KEYS.iter().all(|k| partitions.keys().any(|(key, _, _)| key == k)), "{worker}: a partition span per key");
    }

    let server = &processes["server 0"];
    let (pushes, sums, updates) = (by_part(server, "push"), by_part(server, "sum"), by_part(server, "update"));
    for key in KEYS {
        let parts: BTreeSet<u64> = sums.keys().filter(|(k, _, _)| k == key).map(|(_, o, _)| *o).collect();
        assert!(!parts.is_empty(), "server: no sum span of key {key}");
        for offset in parts {
            for round in 0..ROUNDS {
                let part = (key.to_owned(), offset, round);
                let workers: BTreeSet<u64> = pushes.get(&part).into_iter().flatten().filter_map(|e| e["args"]["worker"].as_u64()).collect();
                assert_eq!(workers, BTreeSet::from([0, 1]), "server: both workers' pushes of {part:?}");
                let sum = sums.get(&part).unwrap_or_else(|| panic!("server: no sum of {part:?}"));
                let update = updates.get(&part).unwrap_or_else(|| panic!("server: no update of {part:?} (t24-opt has an optimizer)"));
                assert!(end(sum[0]) <= start(update[0]) + EPS, "server {part:?}: the sum comes before the update");
            }
        }
    }
    assert!(server.iter().any(|e| e["name"] == "pull" && e["args"]["worker"].is_u64()), "server: pull spans");
    assert!(processes["scheduler"].iter().any(|e| e["name"] == "barrier"), "scheduler: barrier spans");
    assert!(processes["scheduler"].iter().filter(|e| e["name"] == "register").count() == 3, "scheduler: 3 registrations");

    // scripts/trace_steps.py reads the same files: its row counts for round 1 are the spans'.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/trace_steps.py");
    let out = std::process::Command::new("python3").arg(&script).arg(&dir).arg("1").output().expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "trace_steps.py: {text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("round 1 "), "{text}");
    for (role, op) in [("worker 0", "push"), ("worker 1", "pull"), ("server 0", "sum"), ("server 0", "update")] {
        let want = processes[role].iter().filter(|e| e["name"] == op && e["args"]["round"] == 1).count();
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{role:10} {op} ")))
            .unwrap_or_else(|| panic!("no {role} {op} row:\n{text}"));
        let n: usize = row.split_whitespace().nth(3).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("row {row:?}"));
        assert!(want > 0 && n == want, "{role} {op}: the script counts {n} spans of round 1, the trace has {want}:\n{text}");
    }
    // Each worker's stages: five durations, none missing (a server, updates and pulls traced).
    let stages = text.lines().skip_while(|l| !l.trim_start().starts_with("stages")).skip(1);
    let rows: Vec<Vec<f64>> = stages.map(|l| l.split_whitespace().skip(2).filter_map(|v| v.parse().ok()).collect()).collect();
    assert!(rows.len() == 2 && rows.iter().all(|r| r.len() == 5 && r.iter().all(|v| *v >= 0.0)), "stages of both workers:\n{text}");
    std::fs::remove_dir_all(&dir).expect("the trace directory");
}

#[test]
fn survivors_dump_their_flight_recorders_when_a_server_is_killed() {
    let dir = fresh_dir("trace-flight");
    let dir_s = dir.display().to_string();
    let mut job = Job::start(2, 2, &["until-failure", "--max-secs", "80"], &[("SYNKV_TRACE_DIR", dir_s.as_str())]);
    let ready = Instant::now() + Duration::from_secs(40);
    for w in &job.workers {
        assert!(w.wait_for_output("selftest until-failure: running", ready), "{} never started:\n{}", w.label, w.output());
    }
    job.servers[0].kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    for p in job.all_mut().filter(|p| p.label != "server 0") {
        let status = p.wait_until(deadline).unwrap_or_else(|| panic!("{} still runs after server 0 was killed:\n{}", p.label, p.output()));
        assert!(!status.success(), "{}", p.output());
    }

    for (i, w) in job.workers.iter().enumerate() {
        let out = w.output();
        let me = format!("flight recorder of worker {i}");
        assert!(out.contains(&format!("{me}: its last ")), "{} dumped no flight recorder:\n{out}", w.label);
        assert!(
            out.lines().any(|l| l.contains(&format!("{me}: -")) && l.contains("pushpull key x")),
            "{}: one line per operation, naming the op and key:\n{out}",
            w.label
        );
    }
    let out = job.scheduler.output();
    assert!(out.contains("flight recorder of scheduler: its last "), "the scheduler dumps too:\n{out}");

    let found = files(&dir);
    for i in 0..2 {
        let prefix = format!("synkv-worker-{i}-");
        let (_, path) = found
            .iter()
            .find(|(n, _)| n.starts_with(&prefix) && n.ends_with("-flight.json"))
            .unwrap_or_else(|| panic!("no flight file of worker {i}: {:?}", found.keys()));
        let (events, process) = parse_trace(path, (0.0, unix_micros()));
        assert_eq!(process, format!("worker {i}"));
        assert!(events.iter().any(|e| e["name"] == "pushpull" && e["args"]["key"] == "x"), "{}", path.display());
        assert!(events.iter().any(|e| e["name"] == "failure"), "the dump's reason is an instant event");
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let reason = v["otherData"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("server rank 0"), "{reason}");
    }
    std::fs::remove_dir_all(&dir).expect("the trace directory");
}

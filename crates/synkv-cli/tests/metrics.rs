//! `SYNKV_METRICS_ADDR` (issue 14 item 3): a job of one scheduler, one server and one worker,
//! each with an endpoint on `127.0.0.1:0` listed in one `SYNKV_METRICS_FILE`. While the worker
//! holds after its pushes, every endpoint is scraped; the text must parse as the Prometheus
//! text format (a strict parser here, and `promtool check metrics` where installed) and carry
//! the key series with plausible values.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::{Job, JOB_BOUND};

/// Sends `GET path` to `url`'s host and returns (status line, body).
fn get(url: &str, path: &str) -> (String, String) {
    let host = url.trim_start_matches("http://").split('/').next().expect("a host");
    let mut s = TcpStream::connect(host).expect("the metrics endpoint accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("a timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").expect("a request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("a response");
    let (head, body) = out.split_once("\r\n\r\n").expect("a response head");
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

/// Parses exposition text strictly; returns each sample (`name{labels}`) with its value.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    assert!(text.ends_with('\n'), "the text ends with a newline");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut f = rest.splitn(3, ' ');
            let (kw, name, arg) = (f.next().unwrap(), f.next().expect("a name"), f.next().expect("text"));
            assert!(is_name(name), "bad name in {line:?}");
            if kw == "TYPE" {
                assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&arg), "{line:?}");
                assert!(types.insert(name.to_owned(), arg.to_owned()).is_none(), "TYPE repeated: {line:?}");
            } else {
                assert_eq!(kw, "HELP", "{line:?}");
            }
            continue;
        }
        assert!(!line.is_empty(), "empty line");
        let (series, value) = line.rsplit_once(' ').expect("series and value");
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let name = match series.split_once('{') {
            Some((name, labels)) => {
                let labels = labels.strip_suffix('}').expect("closing brace");
                for pair in labels.split(',') {
                    let (k, v) = pair.split_once('=').expect("label=value");
                    assert!(is_name(k), "bad label in {line:?}");
                    assert!(v.len() >= 2 && v.starts_with('"') && v.ends_with('"'), "unquoted label in {line:?}");
                }
                name
            }
            None => series,
        };
        assert!(is_name(name), "bad name in {line:?}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|t| t == "histogram")))
            .unwrap_or(name);
        assert!(types.contains_key(family), "sample before its TYPE: {line:?}");
        assert!(samples.insert(series.to_owned(), v).is_none(), "sample repeated: {line:?}");
    }
    samples
}

fn promtool(text: &str) {
    let Ok(mut child) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    else {
        eprintln!("promtool not installed: skipping its check");
        return;
    };
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("promtool reads");
    let out = child.wait_with_output().expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Fresh paths for a job's `SYNKV_METRICS_FILE` and its `--until-file` (`tag`: the test's).
fn job_files(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let file = tmp.join(format!("{tag}-{}.txt", std::process::id()));
    let until = tmp.join(format!("{tag}-hold-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&until);
    (file, until)
}

#[test]
fn every_role_serves_prometheus_metrics_while_the_job_runs() {
    let (file, until) = job_files("metrics");
    let (file_s, until_s) = (file.display().to_string(), until.display().to_string());
    let env = [("SYNKV_METRICS_ADDR", "127.0.0.1:0"), ("SYNKV_METRICS_FILE", file_s.as_str())];
    // 80 KB values: above the shared-memory threshold, so pulls go through the server's
    // broadcast segment.
    let args = ["push-hold", "--size", "20000", "--repeat", "3", "--sleep-secs", "60", "--until-file", until_s.as_str()];
    let mut job = Job::start(1, 1, &args, &env);
    let deadline = Instant::now() + JOB_BOUND;
    assert!(job.workers[0].wait_for_output("holding for", deadline), "{}", job.workers[0].output());
    let urls: Vec<String> = std::fs::read_to_string(&file).expect("SYNKV_METRICS_FILE").lines().map(str::to_owned).collect();
    assert_eq!(urls.len(), 3, "one endpoint per process: {urls:?}");

    let mut all = BTreeMap::new();
    let mut broadcast = Vec::new();
    for url in &urls {
        assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/metrics"), "{url}");
        let (status, body) = get(url, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK", "{url}");
        promtool(&body);
        let series = parse(&body);
        if series.contains_key("synkv_server_keys{role=\"server\"}") {
            broadcast.push(series.get("synkv_shm_broadcast_total").copied());
        }
        all.extend(series);
        let (status, _) = get(url, "/other");
        assert!(status.starts_with("HTTP/1.1 404"), "{status}");
    }
    let v = |s: &str| *all.get(s).unwrap_or_else(|| panic!("{s} missing from {all:#?}"));
    // 3 pushes of 20000 f32 (plus nothing else through the push path).
    assert_eq!(v("synkv_worker_push_bytes_total{role=\"worker\"}"), 240_000.0);
    assert!(v("synkv_worker_pull_bytes_total{role=\"worker\"}") >= 240_000.0);
    assert!(
        matches!(broadcast[..], [Some(n)] if n >= 3.0),
        "the server's answers with values (a pull's, then pushes' that asked them back) went through its broadcast segment: {broadcast:?}"
    );
    assert_eq!(v("synkv_worker_request_seconds_count{role=\"worker\",op=\"push\"}"), 3.0);
    assert_eq!(v("synkv_worker_request_seconds_count{role=\"worker\",op=\"pull\"}"), 3.0);
    // The second and third pulls were answered from the values their pushes asked back.
    assert_eq!(v("synkv_worker_pulls_held_total{role=\"worker\"}"), 2.0);
    assert_eq!(v("synkv_worker_requests_in_flight{role=\"worker\"}"), 0.0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let last = v("synkv_worker_last_step_timestamp_seconds{role=\"worker\"}");
    assert!(last > now - 120.0 && last <= now + 1.0, "last step {last}, now {now}");
    assert!(v("synkv_server_received_bytes_total{role=\"server\"}") >= 240_000.0);
    assert!(v("synkv_server_sent_bytes_total{role=\"server\"}") >= 240_000.0);
    assert_eq!(v("synkv_server_keys{role=\"server\"}"), 1.0);
    assert_eq!(v("synkv_server_update_seconds_count{role=\"server\"}"), 3.0);
    assert_eq!(v("synkv_server_round_wait_seconds_count{role=\"server\"}"), 3.0);
    assert_eq!(v("synkv_server_stragglers_total{role=\"server\"}"), 0.0);
    assert_eq!(v("synkv_scheduler_live_nodes{role=\"scheduler\",node_role=\"server\"}"), 1.0);
    assert_eq!(v("synkv_scheduler_live_nodes{role=\"scheduler\",node_role=\"worker\"}"), 1.0);
    assert!(v("synkv_scheduler_barriers_total{role=\"scheduler\"}") >= 1.0);

    std::fs::write(&until, b"done").expect("the hold file");
    for p in job.all_mut() {
        let status = p.wait_until(Instant::now() + JOB_BOUND);
        assert!(status.is_some_and(|s| s.success()), "{} failed: {}", p.label, p.output());
    }
}

/// In a real job (the flight recorder on, as always), a push of many keys completes their
/// rounds together and the server updates them side by side on its threads
/// (`SYNKV_SERVER_THREADS=2`, a pool of its own, so this holds on a one-core machine too):
/// every one of the 8 keys' rounds is counted as parallel, and the values pulled back are
/// exact (the selftest checks them).
#[test]
fn a_push_of_many_keys_updates_them_side_by_side_in_a_real_server() {
    let (file, until) = job_files("metrics-batch");
    let (file_s, until_s) = (file.display().to_string(), until.display().to_string());
    let env = [("SYNKV_METRICS_ADDR", "127.0.0.1:0"), ("SYNKV_METRICS_FILE", file_s.as_str()), ("SYNKV_SERVER_THREADS", "2")];
    // 8 keys × 20000 f32 = 640 KB: above the batch's 256 KiB threshold.
    let args =
        ["push-hold", "--size", "20000", "--repeat", "1", "--batch-keys", "8", "--sleep-secs", "60", "--until-file", until_s.as_str()];
    let mut job = Job::start(1, 1, &args, &env);
    let deadline = Instant::now() + JOB_BOUND;
    assert!(job.workers[0].wait_for_output("holding for", deadline), "{}", job.workers[0].output());
    let urls: Vec<String> = std::fs::read_to_string(&file).expect("SYNKV_METRICS_FILE").lines().map(str::to_owned).collect();
    let mut parallel = None;
    for url in &urls {
        let (_, body) = get(url, "/metrics");
        if let Some(v) = parse(&body).get("synkv_server_parallel_rounds_total{role=\"server\"}") {
            parallel = Some(*v);
        }
    }
    assert_eq!(parallel, Some(8.0), "the 8 keys' rounds ran in one parallel batch (the single key's did not)");
    std::fs::write(&until, b"done").expect("the hold file");
    for p in job.all_mut() {
        let status = p.wait_until(Instant::now() + JOB_BOUND);
        assert!(status.is_some_and(|s| s.success()), "{} failed: {}", p.label, p.output());
    }
}

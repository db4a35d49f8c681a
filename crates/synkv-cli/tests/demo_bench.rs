//! `synkv demo`, `synkv demo --dist` and `synkv bench dist` end to end.

use crate::util::{command, run_bounded, synkv, synkv_command};

/// The README's first command: the tutorial's steps print the tutorial's arrays, and the
/// updater's lines come before the arrays they produce. Run several times: an array printed
/// while the printing updater still waited for stdout once deadlocked it.
#[test]
fn the_demo_prints_the_tutorial_arrays_and_exits() {
    let block = |v: u32| format!("[\n [{v} {v} {v}]\n [{v} {v} {v}]\n]");
    for _ in 0..5 {
        let mut cmd = synkv_command();
        cmd.arg("demo");
        let f = run_bounded("demo", cmd, &[]);
        assert!(f.status.success(), "{}", f.output);
        let out = &f.output;
        let at = |needle: &str, from: usize| {
            out[from..].find(needle).map(|i| i + from).unwrap_or_else(|| panic!("missing {needle:?} after byte {from}:\n{out}"))
        };
        let mut pos = at(&block(2), 0);
        pos = at(&block(8), pos);
        pos = at(&block(2), pos);
        pos = at("update on key: 3", pos);
        pos = at(&block(8), pos);
        pos = at(&block(8), pos);
        for k in [5, 7, 9] {
            pos = at(&format!("update on key: {k}"), pos);
        }
        at(&block(4), pos);
    }
}

#[test]
fn the_dist_demo_trains_with_a_falling_loss_and_exits_cleanly() {
    let mut cmd = synkv_command();
    cmd.args(["demo", "--dist", "--epochs", "4"]);
    let f = run_bounded("demo", cmd, &[]);
    assert!(f.status.success(), "{}", f.output);
    let losses: Vec<f64> = f
        .output
        .lines()
        .filter_map(|l| l.split("mean loss ").nth(1))
        .filter_map(|rest| rest.split(',').next())
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    assert_eq!(losses.len(), 4, "{}", f.output);
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "the loss must fall every epoch: {losses:?}");
    assert!(f.output.contains("final: test accuracy"), "{}", f.output);
    assert!(f.output.contains("every process exited cleanly"), "{}", f.output);
}

#[test]
fn bench_dist_prints_one_json_record_per_worker_and_case() {
    let exe = synkv();
    let mut cmd = command(&exe);
    cmd.args(["launch", "-n", "2", "-s", "2", "--"]).arg(&exe);
    cmd.args(["bench", "dist", "--size", "50000", "--keys", "2", "--iters", "3", "--warmup", "1", "--json"]);
    let f = run_bounded("bench", cmd, &[]);
    assert!(f.status.success(), "{}", f.output);
    let records: Vec<serde_json::Value> =
        f.output.lines().filter_map(|l| l.split_once("] ").map(|(_, r)| r)).filter_map(|r| serde_json::from_str(r).ok()).collect();
    assert_eq!(records.len(), 2, "{}", f.output);
    for r in &records {
        for field in ["impl", "case", "size", "keys", "workers", "servers", "updater", "median_ms", "min_ms", "max_ms", "gbps"] {
            assert!(r.get(field).is_some(), "missing {field} in {r}");
        }
        assert_eq!((r["workers"].as_u64(), r["servers"].as_u64(), r["keys"].as_u64()), (Some(2), Some(2), Some(2)));
    }
}

/// `--pushpull`: each iteration is one pushpull of a key cut into parts (64 KiB here) and
/// split over both servers; the bench checks the pulled sums itself and names the case.
#[test]
fn bench_dist_pushpull_times_one_pushpull_per_iteration() {
    let exe = synkv();
    let mut cmd = command(&exe);
    cmd.args(["launch", "-n", "2", "-s", "2", "--"]).arg(&exe);
    cmd.args(["bench", "dist", "--size", "1000003", "--iters", "3", "--warmup", "1", "--pushpull", "--json"]);
    let f = run_bounded("bench", cmd, &[("SYNKV_PARTITION_BYTES", "65536")]);
    assert!(f.status.success(), "{}", f.output);
    let records: Vec<serde_json::Value> =
        f.output.lines().filter_map(|l| l.split_once("] ").map(|(_, r)| r)).filter_map(|r| serde_json::from_str(r).ok()).collect();
    assert_eq!(records.len(), 2, "{}", f.output);
    for r in &records {
        assert!(r["case"].as_str().is_some_and(|c| c.starts_with("dist pushpull size=1000003")), "{r}");
    }
}

/// `synkv bench floor`: every worker process gets back exactly the bytes it sent (an odd size,
/// over two connections each, through the sealed path's 1 MiB calls and piece MACs), and
/// prints one record.
#[test]
fn bench_floor_echoes_every_workers_bytes_and_prints_one_record_each() {
    let mut cmd = synkv_command();
    cmd.args(["bench", "floor", "--bytes", "5000003", "--workers", "2", "--streams", "2", "--iters", "2", "--warmup", "1"]);
    cmd.args(["--sealed", "--json"]);
    let f = run_bounded("bench", cmd, &[]);
    assert!(f.status.success(), "{}", f.output);
    let records: Vec<serde_json::Value> = f.output.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert_eq!(records.len(), 2, "{}", f.output);
    for r in &records {
        assert_eq!((r["impl"].as_str(), r["sealed"].as_bool(), r["streams"].as_u64()), (Some("floor"), Some(true), Some(2)), "{r}");
        assert!(r["median_ms"].as_f64().is_some_and(|m| m > 0.0), "{r}");
    }
}

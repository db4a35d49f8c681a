//! The numbers of MXNet's nightly distributed tests (spec K11) on real processes.

use crate::util::launch;

fn ok(workers: u32, servers: u32, case: &[&str], env: &[(&str, &str)]) -> String {
    let f = launch(workers, servers, &[], case, env);
    assert!(f.status.success(), "{case:?} with {workers} workers and {servers} servers failed:\n{}", f.output);
    for w in 0..workers {
        let line = format!("[worker {w}] selftest {} ok", case[0]);
        assert!(f.output.contains(&line), "missing {line:?}:\n{}", f.output);
    }
    f.output
}

/// T24 with the default assign: every round pulls `n(n+1)/2`; the 1200×1200 keys are split
/// over both servers.
#[test]
fn t24_assign_two_workers_one_and_two_servers() {
    ok(2, 1, &["t24"], &[]);
    ok(2, 2, &["t24"], &[]);
}

#[test]
fn init_takes_rank_zeros_value_and_pulls_right_away() {
    ok(3, 2, &["init-rank0"], &[]);
}

#[test]
fn refused_calls_are_clear_errors_and_change_nothing() {
    let out = ok(2, 1, &["errors"], &[]);
    assert!(out.contains("duplicate init of key a"), "{out}");
    assert!(out.contains("key nobody has not been initialised"), "{out}");
}

/// T24 under the Test optimizer `w += 2·g`: `1 + 2·n(n+1)/2·(i+1)`, 1 and 2 servers.
#[test]
fn t24_test_optimizer_one_and_two_servers() {
    ok(2, 1, &["t24-opt"], &[]);
    ok(2, 2, &["t24-opt"], &[]);
}

/// T34: dist_device_sync with two devices per worker: `1 + 2·2·n(n+1)/2·(i+1)`.
#[test]
fn t34_device_sync_reduces_devices_on_the_worker() {
    ok(2, 2, &["t24-opt", "--store", "dist_device_sync", "--devices", "2"], &[]);
}

/// Sync vs async: in async mode a worker's push is applied (and answered) before the other
/// workers push; with no optimizer the pushed value is assigned.
#[test]
fn async_applies_each_push_on_arrival_with_and_without_an_optimizer() {
    ok(3, 2, &["async-opt", "--store", "dist_async"], &[]);
    ok(2, 1, &["async-assign", "--store", "dist_async"], &[]);
}

/// MXNet #8224: string keys initialised in different orders on different workers.
#[test]
fn string_keys_initialised_in_different_orders_meet_on_the_same_servers() {
    ok(3, 2, &["str-order"], &[]);
}

#[test]
fn multi_precision_keeps_an_f32_master_copy_on_the_servers() {
    ok(2, 2, &["multi-precision"], &[]);
}

#[test]
fn optimizer_states_are_saved_from_and_loaded_into_the_servers() {
    ok(2, 2, &["states"], &[]);
}

/// A small bound splits even small keys over every server.
#[test]
fn t24_with_every_key_split_over_three_servers() {
    ok(2, 3, &["t24-opt"], &[("MXNET_KVSTORE_BIGARRAY_BOUND", "4")]);
}

/// T25: row_sparse pushes of one row per worker; pulls of requested rows (f32 and f16).
#[test]
fn t25_row_sparse_push_and_pull_of_requested_rows() {
    ok(2, 2, &["t25"], &[]);
    ok(3, 1, &["t25"], &[]);
}

/// T26: empty row_sparse pushes change nothing; pulls of every row and of no row.
#[test]
fn t26_row_sparse_with_no_rows() {
    ok(2, 2, &["t26"], &[]);
}

/// T27: a big row_sparse key split by rows over the servers.
#[test]
fn t27_big_row_sparse_key_split_by_rows() {
    ok(2, 2, &["t27"], &[]);
}

/// T30: 100 small and 100 big keys (f32 and f16 halves) initialised in one call.
#[test]
fn t30_init_of_two_hundred_keys() {
    ok(2, 2, &["t30"], &[]);
}

/// T35: broadcast, and in-place pushpull with no optimizer gives `n(n+1)` every repetition.
#[test]
fn t35_broadcast_and_in_place_pushpull() {
    ok(2, 2, &["t35"], &[]);
    ok(3, 1, &["t35", "--store", "dist_device_sync"], &[]);
}

/// T28: 2-bit compression (threshold 0.5) under the Test optimizer: pull before push, zeros,
/// the residual sequence 0.4/0.1/0.2/0.3 → 0, 2n·t, 2n·t, 4n·t, ±ones·t, random gradients;
/// the 1211² and 1200² keys split over two servers in units of packed words (K7.11).
#[test]
fn t28_two_bit_compression() {
    ok(2, 2, &["t28"], &[]);
}

/// T29: 1-bit compression (threshold 0): ones, −ones, the residual sequence 2/0/−2, random.
#[test]
fn t29_one_bit_compression() {
    ok(2, 2, &["t29"], &[]);
}

/// Compression turned on after init keeps working (keys keep their split), compressed
/// pushpull works, and a non-f32 push on a compressing store is a clear error.
#[test]
fn compression_after_init_and_compressed_pushpull() {
    ok(2, 2, &["compress-after-init"], &[]);
    ok(3, 1, &["compress-after-init", "--store", "dist_async"], &[]);
}

/// A pushed array may be overwritten once the push has consumed it, before the servers answer
/// (which, in a sync round, needs every worker's push).
#[test]
fn a_pushed_array_is_free_before_the_round_completes() {
    ok(3, 2, &["push-release"], &[]);
}

/// Issue 13: values cut into dozens of 64 KiB parts (a single-value push one operation per
/// part) reassemble exactly: odd sizes in f32 and f16 by push + pull, pushpull and a
/// two-device push; a row_sparse key; the server's optimizer; 2-bit compression — every
/// element its own value. Over shared memory and over TCP, 2 and 3 workers; then the
/// nightly row_sparse (T27) and compression (T28) cases cut the same way.
#[test]
fn partitioned_values_reassemble_exactly() {
    let small = ("SYNKV_PARTITION_BYTES", "65536");
    ok(2, 2, &["partitions", "--repeat", "2"], &[small]);
    ok(3, 2, &["partitions"], &[small, ("SYNKV_SHM", "0")]);
    ok(2, 2, &["t27"], &[small]);
    ok(2, 2, &["t28"], &[small]);
}

/// A pull after this worker's push is answered from the value the push asked back
/// (`SYNKV_PULL_BACK`, docs/dist.md "Pull after push"): exact under an optimizer that changes
/// every value every round, with a late worker, outputs of two dtypes, keys of every size
/// class (one split over both servers), pulls repeated and pulls skipped; through shared
/// memory, over TCP (small keys only), and switched off.
#[test]
fn pulls_after_pushes_are_answered_from_the_values_sent_back() {
    let case = ["pull-back", "--repeat", "6", "--sleep-secs", "0.3"];
    for env in [&[][..], &[("SYNKV_SHM", "0")], &[("SYNKV_PULL_BACK", "0")]] {
        let out = ok(2, 2, &case, env);
        assert!(out.contains("pulls answered from values sent back with pushes"), "{env:?}:\n{out}");
    }
}

/// The sockets process `pid` holds open.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.flatten().filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))).count())
        .unwrap_or(0)
}

/// `SYNKV_STREAMS=2`: a worker holds two connections to each server and its requests take
/// turns on them; the final weights (SGD with momentum on the servers, a key split over both
/// servers, 64 KiB partitions so a push is many requests) are exactly those of one stream,
/// over TCP and through shared memory.
#[test]
fn several_streams_per_server_carry_exactly_the_same_values() {
    let case = ["ckpt-train", "--repeat", "4"];
    for shm in ["0", "1"] {
        let run = |streams: &str| {
            let env = [("SYNKV_SHM", shm), ("SYNKV_STREAMS", streams), ("SYNKV_PARTITION_BYTES", "65536")];
            let f = launch(2, 2, &[], &case, &env);
            assert!(f.status.success(), "SYNKV_STREAMS={streams} SYNKV_SHM={shm}:\n{}", f.output);
            crate::util::finals(&f.output, 2)
        };
        assert_eq!(run("2"), run("1"), "SYNKV_SHM={shm}");
    }

    // Two servers, two streams each: two more sockets than with one stream. Unset, the
    // default: two streams to a server on this host over TCP, one through shared memory.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let stop = dir.path().join("stop");
    let rounds = ["rounds-until", "--until-file", stop.to_str().expect("a UTF-8 path"), "--max-secs", "120"];
    let count = |streams: Option<&str>, shm: &str| {
        let mut env = vec![("SYNKV_SHM", shm)];
        env.extend(streams.map(|s| ("SYNKV_STREAMS", s)));
        let mut job = crate::util::Job::start(2, 1, &rounds, &env);
        let deadline = std::time::Instant::now() + crate::util::JOB_BOUND;
        assert!(job.workers[0].wait_for_output("selftest rounds-until: running", deadline), "{}", job.workers[0].output());
        let n = sockets(job.workers[0].pid());
        std::fs::write(&stop, b"").expect("the stop file");
        for w in &mut job.workers {
            assert!(w.wait_until(deadline).is_some_and(|s| s.success()), "{}", w.output());
        }
        std::fs::remove_file(&stop).expect("remove the stop file");
        n
    };
    let (one, two, auto) = (count(Some("1"), "0"), count(Some("2"), "0"), count(None, "0"));
    assert_eq!(two, one + 2, "SYNKV_STREAMS=2 with two servers: {one} sockets with one stream, {two} with two");
    assert_eq!(auto, two, "SYNKV_STREAMS unset, TCP to servers on this host: {auto} sockets, {two} with two streams");
    let (one_shm, auto_shm) = (count(Some("1"), "1"), count(None, "1"));
    assert_eq!(auto_shm, one_shm, "SYNKV_STREAMS unset, shared memory: {auto_shm} sockets, {one_shm} with one stream");
}

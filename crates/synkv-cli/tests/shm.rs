//! Shared memory between a worker and a server on one host (`SYNKV_SHM`, on by default; issue
//! 13): the same values as over TCP, segments that go away with a dead peer, and nothing left
//! behind in `/dev/shm`.

use std::time::{Duration, Instant};

use crate::util::{finals, launch, Job, JOB_BOUND};

/// The shared-memory segments (`memfd:synkv-shm`) process `pid` has mapped.
fn segments(pid: u32) -> usize {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines().filter(|l| l.contains("memfd:synkv-shm")).count()
}

fn wait_segments(pid: u32, want: usize, what: &str, output: impl Fn() -> String) {
    let deadline = Instant::now() + JOB_BOUND;
    while segments(pid) != want {
        assert!(Instant::now() < deadline, "{what}: {} segments mapped, not {want}:\n{}", segments(pid), output());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every kind of value the bulk path carries: a big key split over two servers with SGD and
/// momentum (states on the servers), 2-bit compressed pushes, row_sparse keys, dist_device_sync; each job's
/// final weights, printed exactly, are the same over shared memory and over TCP. And async
/// pushes of a split key, checked exactly by the job itself.
#[test]
fn values_over_shared_memory_are_exactly_those_over_tcp() {
    for case in [
        &["ckpt-train", "--repeat", "4"][..],
        &["ckpt-train", "--repeat", "4", "--compression", "2bit"][..],
        &["ckpt-train", "--repeat", "4", "--sparse"][..],
        &["ckpt-train", "--repeat", "4", "--store", "dist_device_sync"][..],
    ] {
        let run = |shm: &str| {
            let f = launch(2, 2, &[], case, &[("SYNKV_SHM", shm)]);
            assert!(f.status.success(), "{case:?} with SYNKV_SHM={shm}:\n{}", f.output);
            finals(&f.output, 2)
        };
        assert_eq!(run("0"), run("1"), "{case:?}");
    }
    let case = ["chaos", "--store", "dist_async", "--keys", "4", "--size", "300000", "--repeat", "8"];
    let f = launch(2, 2, &[], &case, &[("MXNET_KVSTORE_BIGARRAY_BOUND", "1000")]);
    assert!(f.status.success(), "{}", f.output);
    assert!(f.output.contains("lost 0, doubled 0"), "{}", f.output);
}

/// A worker maps three segments per server (its own, the server's for it, and the server's
/// broadcast segment); a server two per worker and its broadcast segment; `SYNKV_SHM=0` maps
/// none. When a server dies (with replicas the job goes on), the workers unmap its segments,
/// and no segment is ever a file in `/dev/shm`.
#[test]
fn segments_are_mapped_per_server_and_go_away_with_a_dead_server() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let stop = dir.path().join("stop");
    let case = ["rounds-until", "--until-file", stop.to_str().expect("a UTF-8 path"), "--max-secs", "120"];

    let mut tcp = Job::start(2, 2, &case, &[("SYNKV_SHM", "0")]);
    let deadline = Instant::now() + JOB_BOUND;
    assert!(tcp.workers[0].wait_for_output("selftest rounds-until: running", deadline), "{}", tcp.workers[0].output());
    assert_eq!(segments(tcp.workers[0].pid()), 0, "SYNKV_SHM=0 maps no segment");
    std::fs::write(&stop, b"").expect("the stop file");
    for w in &mut tcp.workers {
        assert!(w.wait_until(deadline).is_some_and(|s| s.success()), "{}", w.output());
    }
    std::fs::remove_file(&stop).expect("remove the stop file");

    let before: Vec<_> = std::fs::read_dir("/dev/shm").map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    let mut job = Job::start(2, 2, &case, &[("SYNKV_SERVER_REPLICAS", "1")]);
    let deadline = Instant::now() + JOB_BOUND;
    assert!(job.workers[0].wait_for_output("selftest rounds-until: running", deadline), "{}", job.workers[0].output());
    let w0 = job.workers[0].pid();
    wait_segments(w0, 6, "worker 0 with two servers", || job.workers[0].output());
    let server = job.servers[1].pid();
    wait_segments(server, 5, "server 1 with two workers", || job.servers[1].output());

    job.servers[1].kill();
    wait_segments(w0, 3, "worker 0 after server 1 died", || job.workers[0].output());
    std::fs::write(&stop, b"").expect("the stop file");
    for w in &mut job.workers {
        let status = w.wait_until(Instant::now() + JOB_BOUND);
        assert!(status.is_some_and(|s| s.success()), "{}", w.output());
        assert!(w.output().contains("every value exact"), "{}", w.output());
    }
    let after: Vec<_> = std::fs::read_dir("/dev/shm").map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    let new: Vec<_> = after.iter().filter(|f| !before.contains(f)).collect();
    assert!(new.iter().all(|f| !f.to_string_lossy().contains("synkv")), "files left in /dev/shm: {new:?}");
}

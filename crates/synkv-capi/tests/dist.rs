//! The C ABI against a distributed store (issue 6): `examples/c/dist_capi.c` is compiled with
//! `cc` against the shared library and run as both workers of a real job,
//! `synkv launch -n 2 -s 2 --launcher local`, on 127.0.0.1. Once with int keys, once with str
//! keys (a store holds one kind). Each worker checks rank, worker count and type, then pushes
//! and pulls a small and a big key with assign, the Test optimizer and
//! SGD (see the program's comment for the numbers). The whole job is bounded by a timeout.

mod util;

use std::time::Duration;

use util::{command, compile_as, library_dir, run, synkv_exe};

/// Bound on the whole job (scheduler, 2 servers, 2 workers).
const JOB_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn a_c_worker_with_int_keys_runs_a_dist_sync_job_under_the_launcher() {
    c_job("int");
}

#[test]
fn a_c_worker_with_str_keys_runs_a_dist_sync_job_under_the_launcher() {
    c_job("str");
}

/// Runs `dist_capi <kind>` as both workers of a 2-server job and checks that all passed.
fn c_job(kind: &str) {
    let synkv = synkv_exe();
    let lib = library_dir();
    let link = vec![
        format!("-L{}", lib.display()),
        "-lsynkv_capi".into(),
        format!("-Wl,-rpath,{}", lib.display()),
        "-lpthread".into(),
        "-lm".into(),
    ];
    let worker = compile_as("dist_capi", &format!("dist_capi-{kind}"), &link);
    let mut cmd = command(synkv);
    cmd.args(["launch", "-n", "2", "-s", "2", "--launcher", "local", "--grace-secs", "5", "--"]).arg(worker).arg(kind);
    // As in c_programs.rs: the library just linked wins over cargo's LD_LIBRARY_PATH. Short
    // heartbeats and deadlines so a failure ends the job quickly; no inherited job variables
    // (`command`).
    cmd.env("LD_LIBRARY_PATH", &lib)
        .env("SYNKV_HEARTBEAT_INTERVAL_MS", "200")
        .env("SYNKV_HEARTBEAT_TIMEOUT_MS", "2000")
        .env("SYNKV_TIMEOUT_MS", "30000")
        .env("SYNKV_LOG", "warn")
        .env("DIST_CAPI_CHECKPOINT_DIR", std::env::temp_dir().join(format!("synkv-capi-ckpt-{kind}-{}", std::process::id())));
    let out = run(cmd, JOB_TIMEOUT);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the job failed ({}):\n{text}", out.status);
    for w in 0..2 {
        assert!(text.contains(&format!("[worker {w}] dist_capi {kind} ok (rank {w} of 2 workers)")), "{text}");
    }
    assert_eq!(text.matches(" passed, 0 failed").count(), 2, "{text}");
    for label in ["scheduler", "server 0", "server 1"] {
        assert!(text.contains(&format!("[launch] {label} exited successfully")), "{text}");
    }
}

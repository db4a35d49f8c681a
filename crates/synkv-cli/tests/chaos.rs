//! `synkv chaos` (issue 11's conservation harness) in short forms: random processes of a sync
//! and of an async job killed with SIGKILL, the job restarted from its checkpoints each time,
//! every key exact at the end; with replicas, servers killed and the job going on without a
//! restart. And the harness's own check, fed a checkpoint whose round was
//! moved back: the rounds redone are counted twice, and it says so.

use crate::util::{launch, run_bounded, synkv_command};

fn chaos(args: &[&str]) -> crate::util::Finished {
    let mut cmd = synkv_command();
    cmd.arg("chaos").args(args).args(["--max-secs", "80"]);
    run_bounded("chaos", cmd, &[])
}

fn assert_conserved(output: &str, kills: u32) {
    let summary =
        output.lines().find(|l| l.starts_with("chaos: ") && l.contains(" kills (")).unwrap_or_else(|| panic!("no summary:\n{output}"));
    assert!(summary.contains(&format!(", {kills} kills (")), "{summary}");
    assert!(summary.contains("no hang, keys with lost updates 0, with doubled updates 0"), "{summary}");
    // the progress bar is for terminals only: none of its escape codes reach a pipe
    assert!(!output.contains('\x1b') && !output.contains('\r'), "control characters in piped output:\n{output:?}");
}

#[test]
fn a_sync_job_survives_four_kills_of_random_processes_with_every_update_counted_once() {
    let f = chaos(&["--kills", "4", "--seed", "11", "--rounds", "80"]);
    assert!(f.status.success(), "{}", f.output);
    assert_conserved(&f.output, 4);
}

#[test]
fn an_async_job_survives_three_kills_of_random_processes_with_every_update_counted_once() {
    let f = chaos(&["--kills", "3", "--seed", "12", "--rounds", "80", "--store", "dist_async", "-n", "3"]);
    assert!(f.status.success(), "{}", f.output);
    assert_conserved(&f.output, 3);
}

/// With replicas every kill is of a server and no run restarts: the backups take over and the
/// job finishes with every key exact.
#[test]
fn with_replicas_a_sync_job_survives_server_kills_without_restarting() {
    let f = chaos(&["--replicas", "-s", "3", "--kills", "3", "--seed", "21", "--rounds", "80"]);
    assert!(f.status.success(), "{}", f.output);
    assert_conserved(&f.output, 3);
    assert!(f.output.contains("(0 redone after restarts)"), "{}", f.output);
}

#[test]
fn with_replicas_an_async_job_survives_server_kills_without_restarting() {
    let f = chaos(&["--replicas", "-s", "2", "--kills", "3", "--seed", "22", "--rounds", "80", "--store", "dist_async"]);
    assert!(f.status.success(), "{}", f.output);
    assert_conserved(&f.output, 3);
    assert!(f.output.contains("(0 redone after restarts)"), "{}", f.output);
}

/// The check catches doubled updates: a checkpoint of round 10 whose manifest claims round 7
/// makes the restarted job push rounds 8–10 again on top of values that hold them.
#[test]
fn the_conservation_check_reports_updates_counted_twice() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path().to_str().expect("a UTF-8 path");
    let env = [("SYNKV_CHECKPOINT_DIR", d), ("SYNKV_CHECKPOINT_INTERVAL", "5"), ("MXNET_KVSTORE_BIGARRAY_BOUND", "1000")];
    let case = ["chaos", "--keys", "3", "--size", "3000", "--repeat", "10"];
    let f = launch(2, 2, &[], &case, &env);
    assert!(f.status.success(), "{}", f.output);
    let manifest = dir.path().join("MANIFEST.json");
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).expect("a manifest")).expect("JSON");
    assert_eq!(json["round"], 10, "{json}");
    json["round"] = 7.into();
    std::fs::write(&manifest, json.to_string()).expect("rewrite the manifest");

    let f = launch(2, 2, &[], &case, &env);
    assert!(!f.status.success(), "{}", f.output);
    assert!(f.output.contains("checked 4 keys after 10 rounds: lost 0, doubled 4"), "{}", f.output);
}

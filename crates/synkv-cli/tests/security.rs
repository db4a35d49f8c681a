//! Authentication end to end (`SYNKV_SECRET`) and malformed frames sent to a server.

use std::io::Write;
use std::time::{Duration, Instant};

use synkv::ps::proto::{Command as Cmd, Flags, Header, Limits, Message};
use synkv::ps::NodeId;

use crate::util::{free_port, job_env, launch, synkv_command, Proc, Raw, FAST};

const BOUND: Duration = Duration::from_secs(40);

#[test]
fn a_shared_secret_admits_every_node() {
    let f = launch(2, 2, &[], &["t24-opt"], &[("SYNKV_SECRET", "correct horse battery staple")]);
    assert!(f.status.success(), "{}", f.output);
    assert!(!f.output.contains("correct horse"), "the secret leaked into the output:\n{}", f.output);
}

/// One worker with another secret, one with none: both are refused with a clear error, and
/// the rest of the job fails its rendezvous within `SYNKV_TIMEOUT_MS` instead of hanging.
#[test]
fn a_wrong_or_missing_secret_is_refused_and_nothing_hangs() {
    let port = free_port();
    let base = job_env(port, 1, 3);
    let start = |label: &str, role: &str, args: &[&str], secret: Option<&str>, task: Option<u32>| {
        let mut cmd = synkv_command();
        cmd.args(args).envs(FAST).envs(base.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.env("DMLC_ROLE", role).env("SYNKV_TIMEOUT_MS", "6000").env("SYNKV_LOG", "warn");
        if let Some(s) = secret {
            cmd.env("SYNKV_SECRET", s);
        }
        if let Some(t) = task {
            cmd.env("DMLC_TASK_ID", t.to_string());
        }
        Proc::start(label, cmd)
    };
    let worker = ["selftest", "dist", "t24"];
    let mut procs = vec![
        start("scheduler", "scheduler", &["scheduler"], Some("s3cret"), None),
        start("server 0", "server", &["server"], Some("s3cret"), Some(0)),
        start("worker 0", "worker", &worker, Some("s3cret"), Some(0)),
        start("worker 1", "worker", &worker, Some("wrong"), Some(1)),
        start("worker 2", "worker", &worker, None, Some(2)),
    ];
    let deadline = Instant::now() + BOUND;
    for p in &mut procs {
        let status = p.wait_until(deadline).unwrap_or_else(|| panic!("{} hangs:\n{}", p.label, p.output()));
        assert!(!status.success(), "{} succeeded:\n{}", p.label, p.output());
        assert!(!p.output().contains("s3cret"), "the secret leaked:\n{}", p.output());
    }
    assert!(procs[3].output().contains("SYNKV_SECRET differs between nodes"), "{}", procs[3].output());
    assert!(procs[4].output().contains("SYNKV_SECRET is not set on this node"), "{}", procs[4].output());
    assert!(procs[0].output().contains("rendezvous"), "{}", procs[0].output());
}

#[test]
fn malformed_frames_close_only_their_connection() {
    let port = free_port();
    let server_port = free_port();
    let base = job_env(port, 1, 2);
    let role = |label: &str, role: &str, args: &[&str], task: Option<u32>| {
        let mut cmd = synkv_command();
        cmd.args(args).envs(FAST).envs(base.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.env("DMLC_ROLE", role).env("PORT", server_port.to_string()).env("SYNKV_LOG", "warn");
        if let Some(t) = task {
            cmd.env("DMLC_TASK_ID", t.to_string());
        }
        Proc::start(label, cmd)
    };
    let worker = ["selftest", "dist", "rounds", "--repeat", "1500"];
    let mut procs = vec![role("scheduler", "scheduler", &["scheduler"], None), role("server 0", "server", &["server"], Some(0))];
    procs.push(role("worker 0", "worker", &worker, Some(0)));
    procs.push(role("worker 1", "worker", &worker, Some(1)));
    assert!(procs[2].wait_for_output("selftest rounds: running", Instant::now() + BOUND), "{}", procs[2].output());

    // 1. Not our protocol.
    let mut raw = Raw::connect(server_port);
    raw.s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let got = raw.until_close();
    assert!(got.iter().any(|m| m.command == Cmd::Error && m.meta.text.contains("bad magic")), "{got:?}");

    // 2. A header announcing a body above the limit.
    let mut raw = Raw::connect(server_port);
    let mut head = bytes::BytesMut::new();
    let small = Message::new(Cmd::Push).encode_to_bytes(&Limits::default()).unwrap();
    Header { body_len: 1 << 40, ..Header::decode(&small, &Limits::default()).unwrap() }.encode_into(&mut head);
    raw.s.write_all(&head).unwrap();
    let got = raw.until_close();
    assert!(got.iter().any(|m| m.command == Cmd::Error && m.meta.text.contains("above the limit")), "{got:?}");

    // 3. A well-formed request from a sender that is not a worker of this cluster.
    let mut raw = Raw::open(server_port);
    let mut m = Message::new(Cmd::Pull).with_sender(NodeId::SCHEDULER).with_flags(Flags::REQUEST).with_request_id(5);
    m.meta.keys.push(1);
    m.meta.lens.push(4);
    raw.s.write_all(&m.encode_to_bytes(&Limits::default()).unwrap()).unwrap();
    let got = raw.until_close();
    assert!(got.iter().any(|m| m.command == Cmd::Error && m.meta.text.contains("not a worker")), "{got:?}");

    // 4. An unknown key from a worker id: an error reply, and the connection stays open.
    let mut raw = Raw::open(server_port);
    let mut m = Message::new(Cmd::Pull).with_sender(NodeId::worker(0).unwrap()).with_flags(Flags::REQUEST).with_request_id(6);
    m.meta.keys.push(123_456);
    m.meta.lens.push(4);
    raw.s.write_all(&m.encode_to_bytes(&Limits::default()).unwrap()).unwrap();
    let reply = raw.next().expect("a reply");
    assert_eq!((reply.command, reply.request_id), (Cmd::Error, 6));
    assert!(reply.meta.text.contains("has not been initialised"), "{}", reply.meta.text);
    drop(raw);

    // The job itself is unaffected and finishes cleanly.
    let deadline = Instant::now() + Duration::from_secs(80);
    for p in &mut procs {
        let status = p.wait_until(deadline).unwrap_or_else(|| panic!("{} hangs:\n{}", p.label, p.output()));
        assert!(status.success(), "{} failed:\n{}", p.label, p.output());
    }
}

//! Rogue clients against real jobs secured by a shared secret: without it, with a wrong one,
//! replaying a recorded handshake, posing as the scheduler, claiming another rank, flipping a
//! bit after the handshake, or holding many idle connections. Each is refused, and the job's
//! values are unchanged: its workers check every round's value exactly and finish cleanly.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use synkv::ps::auth::{self, Identity};
use synkv::ps::proto::{Command as Cmd, Flags, Message};
use synkv::ps::{AuthError, Connection, Error, NodeId, Role, Secret, TcpTransport, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::util::{free_port, job_env, synkv_command, Proc, FAST, JOB_BOUND};

/// The job's secret (64 hex digits, as `synkv launch` makes them).
const SECRET: &str = "9b1f0c4e7d2a58b3c6e9f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f";
/// Bound on one rogue step.
const T: Duration = Duration::from_secs(10);

struct Secured {
    procs: Vec<Proc>,
    sched_port: u16,
    server_port: u16,
}

/// Starts a scheduler and one server with [`SECRET`] (the server on a known port), and, with
/// `workers`, two workers running `case` (their own secret: `worker_secret`).
fn start(case: &[&str], workers: bool) -> Secured {
    let (sched_port, server_port) = (free_port(), free_port());
    let base = job_env(sched_port, 1, 2);
    let mut procs = Vec::new();
    let role = |label: &str, role: &str, args: &[&str], task: Option<u32>| {
        let mut cmd = synkv_command();
        cmd.args(args).envs(FAST).envs(base.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.env("DMLC_ROLE", role).env("SYNKV_SECRET", SECRET).env("SYNKV_LOG", "warn");
        if role == "server" {
            cmd.env("PORT", server_port.to_string());
        }
        if let Some(t) = task {
            cmd.env("DMLC_TASK_ID", t.to_string());
        }
        Proc::start(label, cmd)
    };
    procs.push(role("scheduler", "scheduler", &["scheduler"], None));
    procs.push(role("server 0", "server", &["server"], Some(0)));
    if workers {
        for w in 0..2 {
            procs.push(role(&format!("worker {w}"), "worker", case, Some(w)));
        }
    }
    Secured { procs, sched_port, server_port }
}

fn finish(procs: &mut [Proc]) {
    let deadline = Instant::now() + JOB_BOUND;
    for p in procs.iter_mut() {
        let status = p.wait_until(deadline).unwrap_or_else(|| panic!("{} hangs:\n{}", p.label, p.output()));
        assert!(status.success(), "{} failed:\n{}", p.label, p.output());
        assert!(!p.output().contains(SECRET), "the secret leaked:\n{}", p.output());
    }
}

fn secret(s: &str) -> Secret {
    Secret::new(s).expect("a non-empty secret")
}

async fn dial(port: u16) -> Connection {
    TcpTransport::default().connect(&format!("127.0.0.1:{port}")).await.expect("connect")
}

async fn handshake(port: u16, with: Option<&str>, me: Identity, expect: Role) -> synkv::ps::Result<Connection> {
    let mut conn = dial(port).await;
    let s = with.map(secret);
    auth::connect(&mut conn, s.as_ref(), me, expect, T).await.map(|()| conn)
}

/// Whether the peer closes `conn` (after at most a few frames) within [`T`].
async fn closed(conn: &mut Connection) -> bool {
    let until = tokio::time::Instant::now() + T;
    loop {
        match tokio::time::timeout_at(until, conn.read_message()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None) | Err(_)) => return true,
            Err(_) => return false,
        }
    }
}

/// A relay on 127.0.0.1 to `port` for one connection: records what the client sends, and
/// flips one bit of client byte number `flip_at` (once set).
struct Relay {
    port: u16,
    recorded: tokio::sync::oneshot::Receiver<Vec<u8>>,
    forwarded: Arc<AtomicUsize>,
    flip_at: Arc<AtomicUsize>,
}

async fn relay(to: u16) -> Relay {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the relay");
    let port = listener.local_addr().expect("relay address").port();
    let (forwarded, flip_at) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(usize::MAX)));
    let (count, at) = (forwarded.clone(), flip_at.clone());
    let (done, recorded) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.expect("relay accept");
        let server = TcpStream::connect(("127.0.0.1", to)).await.expect("relay connect");
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut sr, &mut cw).await;
        });
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = cr.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            let (total, target) = (count.load(SeqCst), at.load(SeqCst));
            if (total..total + n).contains(&target) {
                buf[target - total] ^= 0x01;
            }
            seen.extend_from_slice(&buf[..n]);
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            count.fetch_add(n, SeqCst);
        }
        let _ = done.send(seen);
    });
    Relay { port, recorded, forwarded, flip_at }
}

fn worker(rank: u32) -> Identity {
    Identity::new(Role::Worker, NodeId::worker(rank).expect("a worker id"))
}

fn pull(sender: NodeId, id: u64) -> Message {
    let mut m = Message::new(Cmd::Pull).with_sender(sender).with_flags(Flags::REQUEST).with_request_id(id);
    m.meta.keys.push(123_456);
    m.meta.lens.push(4);
    m
}

#[test]
fn rogue_clients_are_refused_and_the_job_is_unchanged() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let stop = dir.path().join("stop");
    let case = ["selftest", "dist", "rounds-until", "--until-file", stop.to_str().expect("utf-8 path"), "--max-secs", "120"];
    let mut job = start(&case, true);
    assert!(job.procs[2].wait_for_output("selftest rounds-until: running", Instant::now() + JOB_BOUND), "{}", job.procs[2].output());
    let (sched, server) = (job.sched_port, job.server_port);
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    rt.block_on(async {
        for (port, expect) in [(sched, Role::Scheduler), (server, Role::Server)] {
            // Without the secret, and with a wrong one.
            let e = handshake(port, None, worker(1), expect).await.expect_err("refused without the secret");
            assert!(matches!(e, Error::Auth(AuthError::SecretMissing { .. })), "{e}");
            let e = handshake(port, Some("not-the-secret"), worker(1), expect).await.expect_err("refused with a wrong secret");
            assert!(matches!(e, Error::Auth(AuthError::Rejected { .. })), "{e}");
        }

        // A recorded handshake (an eavesdropper's copy of a genuine one) replayed later.
        let tap = relay(server).await;
        let genuine = handshake(tap.port, Some(SECRET), worker(1), Role::Server).await.expect("the genuine handshake");
        drop(genuine);
        let recorded = tap.recorded.await.expect("the recording");
        let mut replay = TcpStream::connect(("127.0.0.1", server)).await.expect("connect");
        replay.write_all(&recorded).await.expect("replay");
        let mut answer = Vec::new();
        let read = tokio::time::timeout(T, replay.read_to_end(&mut answer)).await;
        assert!(matches!(read, Ok(Ok(_)) | Ok(Err(_))), "the server did not close the replayed connection");

        // An insider (it holds the secret) speaking for another rank than it authenticated as.
        let mut insider = handshake(server, Some(SECRET), worker(1), Role::Server).await.expect("insider handshake");
        insider.write_message(&pull(NodeId::worker(0).expect("id"), 7)).await.expect("send");
        let reply = tokio::time::timeout(T, insider.read_message()).await.expect("an answer").expect("a frame").expect("not closed yet");
        assert_eq!(reply.command, Cmd::Error);
        assert!(reply.meta.text.contains("cannot speak for another node"), "{}", reply.meta.text);
        assert!(closed(&mut insider).await, "the connection stays open after speaking for another rank");
        // ... or claiming a rank the cluster does not have.
        let mut outsider = handshake(server, Some(SECRET), worker(5), Role::Server).await.expect("handshake");
        outsider.write_message(&pull(NodeId::worker(5).expect("id"), 8)).await.expect("send");
        let reply = tokio::time::timeout(T, outsider.read_message()).await.expect("an answer").expect("a frame").expect("a reply");
        assert!(reply.meta.text.contains("not a worker of this cluster"), "{}", reply.meta.text);

        // A bit flipped on the way in a frame after the handshake.
        let mitm = relay(server).await;
        let mut conn = handshake(mitm.port, Some(SECRET), worker(1), Role::Server).await.expect("handshake through the relay");
        conn.write_message(&pull(NodeId::worker(1).expect("id"), 9)).await.expect("send");
        let reply = tokio::time::timeout(T, conn.read_message()).await.expect("an answer").expect("a frame").expect("a reply");
        assert_eq!((reply.command, reply.request_id), (Cmd::Error, 9), "an intact frame is answered: {}", reply.meta.text);
        mitm.flip_at.store(mitm.forwarded.load(SeqCst) + 20, SeqCst);
        conn.write_message(&pull(NodeId::worker(1).expect("id"), 10)).await.expect("send");
        assert!(closed(&mut conn).await, "a frame with a flipped bit was not refused");
    });
    std::fs::write(&stop, b"").expect("the stop file");
    finish(&mut job.procs);
    let server_log = job.procs[1].output();
    // Without the secret, with a wrong one and the replay: three refused handshakes.
    assert!(server_log.matches("failed the handshake").count() >= 3, "{server_log}");
    for refusal in ["integrity check", "cannot speak for another node", "not a worker of this cluster"] {
        assert!(server_log.contains(refusal), "the server logged no {refusal:?}:\n{server_log}");
    }
    for w in &job.procs[2..] {
        assert!(w.output().contains("every value exact"), "{}", w.output());
    }
}

/// Idle connections (more than the pending bound, from one address) to the scheduler and the
/// server before the workers start: the workers still get in and the job finishes.
#[test]
fn idle_connections_do_not_keep_nodes_out() {
    let mut job = start(&[], false);
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let idle = rt.block_on(async {
        let mut idle = Vec::new();
        for port in [job.sched_port, job.server_port] {
            wait_listening(port).await;
            for _ in 0..150 {
                if let Ok(s) = TcpStream::connect(("127.0.0.1", port)).await {
                    idle.push(s);
                }
            }
        }
        idle
    });
    assert!(idle.len() >= 150, "the flood could not even connect ({} connections)", idle.len());
    let base = job_env(job.sched_port, 1, 2);
    for w in 0..2u32 {
        let mut cmd = synkv_command();
        cmd.args(["selftest", "dist", "rounds", "--repeat", "50"]).envs(FAST).envs(base.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.env("DMLC_ROLE", "worker").env("SYNKV_SECRET", SECRET).env("SYNKV_LOG", "warn").env("DMLC_TASK_ID", w.to_string());
        job.procs.push(Proc::start(&format!("worker {w}"), cmd));
    }
    finish(&mut job.procs);
    drop(idle);
}

/// Waits (bounded) until something listens on `port`.
async fn wait_listening(port: u16) {
    let until = Instant::now() + JOB_BOUND;
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < until, "nothing listens on {port}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A worker holding the secret refuses a scheduler that does not authenticate (anyone can
/// start one), instead of handing it its values.
#[test]
fn a_worker_refuses_a_scheduler_without_the_secret() {
    let port = free_port();
    let base = job_env(port, 1, 1);
    let mut cmd = synkv_command();
    cmd.arg("scheduler").envs(FAST).envs(base.iter().map(|(k, v)| (k.as_str(), v.as_str()))).env("DMLC_ROLE", "scheduler");
    let mut fake = Proc::start("fake scheduler", cmd);
    let mut cmd = synkv_command();
    cmd.args(["selftest", "dist", "t24"]).envs(FAST).envs(base.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    cmd.env("DMLC_ROLE", "worker").env("SYNKV_SECRET", SECRET).env("SYNKV_TIMEOUT_MS", "5000");
    let mut w = Proc::start("worker", cmd);
    let status = w.wait_until(Instant::now() + JOB_BOUND).unwrap_or_else(|| panic!("the worker hangs:\n{}", w.output()));
    assert!(!status.success(), "{}", w.output());
    assert!(w.output().contains("does not require authentication"), "{}", w.output());
    fake.kill();
}

/// Without a secret, a process refuses to listen on an address other machines can reach,
/// unless `SYNKV_INSECURE=1` says the network is trusted (then it warns).
#[test]
fn listening_beyond_loopback_needs_a_secret_or_insecure() {
    for insecure in [false, true] {
        let port = free_port();
        let mut cmd = synkv_command();
        cmd.arg("scheduler").envs(FAST).envs(job_env(port, 1, 1).iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.env("DMLC_ROLE", "scheduler").env("DMLC_PS_ROOT_URI", "0.0.0.0").env("SYNKV_TIMEOUT_MS", "3000");
        if insecure {
            cmd.env("SYNKV_INSECURE", "1");
        }
        let mut p = Proc::start("scheduler", cmd);
        let status = p.wait_until(Instant::now() + JOB_BOUND).unwrap_or_else(|| panic!("hangs:\n{}", p.output()));
        assert!(!status.success(), "{}", p.output());
        if insecure {
            assert!(p.output().contains("without authentication"), "{}", p.output());
            assert!(p.output().contains("rendezvous"), "it listened and waited for the nodes:\n{}", p.output());
        } else {
            assert!(p.output().contains("SYNKV_SECRET: is not set"), "{}", p.output());
            assert!(p.output().contains("SYNKV_INSECURE=1"), "{}", p.output());
        }
    }
}

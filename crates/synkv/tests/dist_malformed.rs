//! Malformed input on real sockets: a bad frame closes only the connection that sent it (with
//! an `Error` reply where possible) and the scheduler keeps serving everyone else.

mod dist_util;

use std::time::Duration;

use bytes::BytesMut;
use dist_util::{bounded, join_all, start_scheduler};
use synkv::ps::proto::{check, parse, Command, Header, Limits, Message};
use synkv::ps::{auth, Error, Group, Node, NodeId, Role, TcpTransport, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads every frame the scheduler sends until it closes the connection.
async fn frames_until_close(stream: &mut TcpStream) -> Vec<Message> {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    loop {
        while let Ok(Some(n)) = check(&buf, &Limits::default()) {
            out.push(parse(buf.split_to(n).freeze(), &Limits::default()).unwrap());
        }
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_buf(&mut buf)).await.expect("scheduler never closed");
        match read {
            Ok(0) | Err(_) => return out,
            Ok(_) => {}
        }
    }
}

/// Reads exactly one frame from a raw socket.
async fn next_frame(raw: &mut TcpStream, buf: &mut BytesMut) -> Message {
    loop {
        if let Some(n) = check(buf, &Limits::default()).unwrap() {
            return parse(buf.split_to(n).freeze(), &Limits::default()).unwrap();
        }
        assert!(raw.read_buf(buf).await.unwrap() > 0, "closed early");
    }
}

fn commands(frames: &[Message]) -> Vec<Command> {
    frames.iter().map(|m| m.command).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_oversized_and_out_of_order_frames_close_only_their_connection() {
    bounded(async {
        let t = TcpTransport::default();
        let sched = start_scheduler(&t, 1, 1, &[]).await;
        let addr = sched.config.root_addr();

        // 1. Not our protocol at all.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let got = frames_until_close(&mut s).await;
        assert_eq!(commands(&got), vec![Command::Error]);
        assert!(got[0].meta.text.contains("bad magic"), "{}", got[0].meta.text);

        // 2. A valid header announcing a body far above the limit: refused from the header alone.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let mut header = BytesMut::new();
        let hb = Message::new(Command::Register).encode_to_bytes(&Limits::default()).unwrap();
        Header { body_len: 1 << 40, ..Header::decode(&hb, &Limits::default()).unwrap() }.encode_into(&mut header);
        s.write_all(&header).await.unwrap();
        let got = frames_until_close(&mut s).await;
        assert_eq!(commands(&got), vec![Command::Error]);
        assert!(got[0].meta.text.contains("body length"), "{}", got[0].meta.text);

        // 3. A well-formed frame that is not a Register.
        let mut c = t.connect(&addr).await.unwrap();
        auth::connect(&mut c, None, auth::Identity::new(Role::Worker, NodeId::NONE), Role::Scheduler, Duration::from_secs(5))
            .await
            .unwrap();
        c.write_message(&Message::new(Command::Heartbeat)).await.unwrap();
        assert_eq!(c.read_message().await.unwrap().unwrap().command, Command::Error);
        assert!(c.read_message().await.unwrap().is_none());

        // 4. A Register carrying no node.
        let mut c = t.connect(&addr).await.unwrap();
        auth::connect(&mut c, None, auth::Identity::new(Role::Worker, NodeId::NONE), Role::Scheduler, Duration::from_secs(5))
            .await
            .unwrap();
        c.write_message(&Message::new(Command::Register)).await.unwrap();
        assert_eq!(c.read_message().await.unwrap().unwrap().command, Command::Error);
        assert!(c.read_message().await.unwrap().is_none());

        // 5. A client that connects and says nothing is dropped after the handshake deadline
        //    (the heartbeat timeout, 1 s here) while the cluster still forms, without a word.
        let mut silent = TcpStream::connect(&addr).await.unwrap();

        // None of that counted: the real nodes form the cluster and finish cleanly.
        let nodes = join_all(&t, &sched.config, &[(Role::Server, None), (Role::Worker, None)]).await;
        let mut it = nodes.into_iter();
        let (server, worker) = (it.next().unwrap(), it.next().unwrap());
        worker.barrier(Group::WORKERS).await.unwrap();
        let got = frames_until_close(&mut silent).await;
        assert_eq!(commands(&got), vec![]);
        let srv = tokio::spawn(async move { server.wait_shutdown().await });
        worker.finish().await.unwrap();
        srv.await.unwrap().unwrap();
        sched.handle.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_node_sending_garbage_is_cut_off_and_reported() {
    bounded(async {
        let t = TcpTransport::default();
        let sched = start_scheduler(&t, 1, 1, &[]).await;
        let server = tokio::spawn({
            let (t, cfg) = (t.clone(), sched.config.clone());
            async move { join_all(&t, &cfg, &[(Role::Server, None)]).await.pop().unwrap() }
        });
        // A hand-driven worker on a raw socket: register, read the node list, send garbage.
        let mut raw = TcpStream::connect(&sched.config.root_addr()).await.unwrap();
        let mut buf = BytesMut::new();
        raw.write_all(&Message::hello(Role::Worker, &[]).encode_to_bytes(&Limits::default()).unwrap()).await.unwrap();
        assert_eq!(next_frame(&mut raw, &mut buf).await.command, Command::AuthOk);
        let register = Message::register(Node::unassigned(Role::Worker, "127.0.0.1", 4242, None));
        raw.write_all(&register.encode_to_bytes(&Limits::default()).unwrap()).await.unwrap();
        assert_eq!(next_frame(&mut raw, &mut buf).await.command, Command::NodeList);
        let server = server.await.unwrap();
        raw.write_all(b"SKV1 but then nonsense that is no header at all").await.unwrap();
        match server.wait_shutdown().await.unwrap_err() {
            Error::LostPeer { node, .. } => assert_eq!((node.role, node.rank, node.port), (Role::Worker, Some(0), 4242)),
            other => panic!("expected LostPeer, got {other}"),
        }
        match sched.handle.await.unwrap() {
            Err(Error::LostPeer { reason, .. }) => assert!(reason.contains("protocol error"), "{reason}"),
            other => panic!("expected LostPeer, got {other:?}"),
        }
        drop(raw);
    })
    .await;
}

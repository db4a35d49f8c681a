//! Heartbeat and failure-detection timing on paused tokio time, over the in-memory transport
//! (real sockets and an auto-advancing clock do not mix).

mod dist_util;

use std::time::Duration;

use dist_util::{bounded, config, join_all, start_scheduler};
use synkv::ps::proto::{Command, Message};
use synkv::ps::{auth, Cluster, Error, Group, Listener, MemTransport, Node, NodeId, Role, Transport};
use tokio::time::Instant;

const INTERVAL: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_millis(1000);

#[tokio::test(start_paused = true)]
async fn a_silent_node_is_declared_dead_after_the_heartbeat_timeout() {
    bounded(async {
        let t = MemTransport::default();
        let sched = start_scheduler(&t, 1, 2, &[]).await;
        let nodes = tokio::spawn({
            let (t, cfg) = (t.clone(), sched.config.clone());
            async move { join_all(&t, &cfg, &[(Role::Server, None), (Role::Worker, Some(0))]).await }
        });
        // A worker that registers, gets its rank, then never speaks again (but stays connected).
        let mut hung = t.connect(&sched.config.root_addr()).await.unwrap();
        auth::connect(&mut hung, None, auth::Identity::new(Role::Worker, NodeId::NONE), Role::Scheduler, TIMEOUT).await.unwrap();
        hung.write_message(&Message::register(Node::unassigned(Role::Worker, "127.0.0.1", 7777, Some(1)))).await.unwrap();
        assert_eq!(hung.read_message().await.unwrap().unwrap().command, Command::NodeList);
        let formed = Instant::now();
        let nodes = nodes.await.unwrap();

        for n in &nodes {
            match n.failed().await {
                Error::LostPeer { node, reason } => {
                    assert_eq!((node.role, node.rank, node.port), (Role::Worker, Some(1), 7777));
                    assert!(reason.contains("no heartbeat"), "{reason}");
                }
                other => panic!("expected LostPeer, got {other}"),
            }
        }
        let after = formed.elapsed();
        assert!(after > TIMEOUT && after <= TIMEOUT + 2 * INTERVAL, "declared dead after {after:?}");
        assert!(matches!(sched.handle.await.unwrap(), Err(Error::LostPeer { .. })));
        // The dead node's own connection was closed by the scheduler.
        assert!(!matches!(hung.read_message().await, Ok(Some(_))));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_silent_scheduler_is_declared_dead_by_its_nodes() {
    bounded(async {
        let t = MemTransport::default();
        let mut listener = t.bind("127.0.0.1:0").await.unwrap();
        let port: u16 = listener.local_addr().unwrap().rsplit_once(':').unwrap().1.parse().unwrap();
        let cfg = config(port, 1, 1, &[("DMLC_ROLE", "worker")]);
        // A fake scheduler: handshake, node list, then silence (connection kept open).
        let fake = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            auth::accept(&mut conn, None, auth::Identity::new(Role::Scheduler, NodeId::SCHEDULER), TIMEOUT).await.unwrap();
            let reg = conn.read_message().await.unwrap().unwrap();
            let mut me = reg.single_node().unwrap().clone();
            me.rank = Some(0);
            me.id = NodeId::worker(0).unwrap();
            let server = Node { rank: Some(0), id: NodeId::server(0).unwrap(), ..Node::unassigned(Role::Server, "127.0.0.1", 1, None) };
            conn.write_message(&Message::node_list(vec![me, server], NodeId::worker(0).unwrap())).await.unwrap();
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(conn);
        });
        let cluster = Cluster::join(&t, &cfg, 5, Default::default()).await.unwrap();
        let joined = Instant::now();
        match cluster.barrier(Group::WORKERS).await.unwrap_err() {
            Error::LostPeer { node, reason } => {
                assert_eq!(node.role, Role::Scheduler);
                assert!(reason.contains("no answer"), "{reason}");
            }
            other => panic!("expected LostPeer, got {other}"),
        }
        let after = joined.elapsed();
        assert!(after > TIMEOUT && after <= TIMEOUT + 2 * INTERVAL, "declared dead after {after:?}");
        fake.abort();
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn heartbeats_keep_an_idle_cluster_alive() {
    bounded(async {
        let t = MemTransport::default();
        let sched = start_scheduler(&t, 1, 2, &[("SYNKV_TIMEOUT_MS", "600000")]).await;
        let mut nodes = join_all(&t, &sched.config, &[(Role::Server, None), (Role::Worker, None), (Role::Worker, None)]).await;
        // Idle for 50 heartbeat timeouts (virtual time; below the test's own bound).
        tokio::time::sleep(Duration::from_secs(50)).await;
        for n in &nodes {
            n.check().unwrap();
        }
        let w1 = nodes.pop().unwrap();
        let w0 = nodes.pop().unwrap();
        let server = nodes.pop().unwrap();
        let (a, b) = tokio::join!(w0.barrier(Group::WORKERS), w1.barrier(Group::WORKERS));
        a.unwrap();
        b.unwrap();
        let (a, b, c) = tokio::join!(w0.finish(), w1.finish(), server.wait_shutdown());
        a.unwrap();
        b.unwrap();
        c.unwrap();
        server.close().await;
        sched.handle.await.unwrap().unwrap();
    })
    .await;
}

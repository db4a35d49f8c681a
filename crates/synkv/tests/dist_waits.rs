//! Slow is not dead (issue 10): barriers and a worker's finish wait as long as every node is
//! alive, however long that is, and end by failure detection; finished workers count as
//! arrived at barriers and as done whether or not they are still connected. Paused tokio time
//! over the in-memory transport, so "ten times the timeout" costs nothing.

mod dist_util;

use std::time::Duration;

use dist_util::{bounded, join_all, start_scheduler, Running};
use synkv::ps::{Cluster, Error, Group, MemTransport, Role};

/// `SYNKV_TIMEOUT_MS` in these tests.
const TIMEOUT: Duration = Duration::from_secs(5);

/// A formed cluster of one server and two workers (ranks 0 and 1) on `t`, with its scheduler.
async fn cluster(t: &MemTransport) -> (Running, Cluster, Cluster, Cluster) {
    let sched = start_scheduler(t, 1, 2, &[("SYNKV_TIMEOUT_MS", "5000")]).await;
    let mut nodes = join_all(t, &sched.config, &[(Role::Server, None), (Role::Worker, Some(0)), (Role::Worker, Some(1))]).await;
    let (w1, w0, server) = (nodes.pop().unwrap(), nodes.pop().unwrap(), nodes.pop().unwrap());
    (sched, server, w0, w1)
}

#[tokio::test(start_paused = true)]
async fn a_barrier_waits_for_a_slow_worker_far_beyond_the_timeout() {
    bounded(async {
        let t = MemTransport::default();
        let (sched, server, fast, slow) = cluster(&t).await;
        let waiting = tokio::spawn(async move { (fast.barrier(Group::WORKERS).await, fast) });
        tokio::time::sleep(10 * TIMEOUT).await;
        assert!(!waiting.is_finished(), "the barrier waits for the slow worker");
        slow.barrier(Group::WORKERS).await.unwrap();
        let (released, fast) = waiting.await.unwrap();
        released.unwrap();
        for n in [&server, &fast, &slow] {
            n.check().unwrap();
        }
        sched.stop.cancel();
        sched.handle.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_barrier_ends_when_a_member_dies() {
    bounded(async {
        let t = MemTransport::default();
        let (sched, _server, w, dying) = cluster(&t).await;
        let waiting = tokio::spawn(async move { w.barrier(Group::WORKERS).await });
        tokio::time::sleep(3 * TIMEOUT).await;
        drop(dying); // its connection closes: the scheduler declares it dead
        match waiting.await.unwrap() {
            Err(Error::LostPeer { node, .. }) => assert_eq!((node.role, node.rank), (Role::Worker, Some(1))),
            other => panic!("expected LostPeer, got {other:?}"),
        }
        let _ = sched.handle.await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn workers_finishing_far_apart_all_end_cleanly_and_a_finished_worker_counts_at_barriers() {
    bounded(async {
        let t = MemTransport::default();
        let (sched, server, early, late) = cluster(&t).await;
        let mut done = server.done_workers();
        let finishing = tokio::spawn(early.finish());
        done.wait_for(|d| d.ranks.contains(&0)).await.unwrap();
        // The finished worker takes part in no later barrier: the other one is not held up.
        late.barrier(Group::WORKERS).await.unwrap();
        tokio::time::sleep(10 * TIMEOUT).await;
        assert!(!finishing.is_finished(), "the early worker waits for the others, however long");
        late.finish().await.unwrap();
        finishing.await.unwrap().unwrap();
        server.wait_shutdown().await.unwrap();
        sched.handle.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_finished_worker_that_left_still_counts_as_done() {
    bounded(async {
        let t = MemTransport::default();
        let (sched, server, early, late) = cluster(&t).await;
        let mut done = server.done_workers();
        // The early worker says it is done, then its process goes away (connection closed).
        let finishing = tokio::spawn(early.finish());
        done.wait_for(|d| d.ranks.contains(&0)).await.unwrap();
        finishing.abort();
        let _ = finishing.await;
        tokio::time::sleep(3 * TIMEOUT).await;
        server.check().unwrap();
        late.check().unwrap();
        late.finish().await.unwrap();
        server.wait_shutdown().await.unwrap();
        sched.handle.await.unwrap().unwrap();
    })
    .await;
}

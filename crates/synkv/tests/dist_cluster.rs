//! Real-socket cluster tests on 127.0.0.1: rendezvous, ranks, barriers, clean shutdown,
//! failure reporting, late and surplus registrations, rendezvous timeout.

mod dist_util;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dist_util::{bounded, join_all, start_scheduler};
use synkv::ps::{Error, Group, NodeId, Role, TcpTransport};

const TWO_SERVERS_THREE_WORKERS: [(Role, Option<u32>); 5] =
    [(Role::Worker, None), (Role::Server, None), (Role::Worker, None), (Role::Server, None), (Role::Worker, None)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_rendezvous_agree_on_ranks_barrier_and_shut_down_cleanly() {
    bounded(async {
        let t = TcpTransport::default();
        let sched = start_scheduler(&t, 2, 3, &[]).await;
        let nodes = join_all(&t, &sched.config, &TWO_SERVERS_THREE_WORKERS).await;

        // Everyone sees the same list: scheduler + 2 servers + 3 workers, ranks 0..n per role.
        let list = nodes[0].nodes().to_vec();
        assert_eq!(list.len(), 6);
        for n in &nodes {
            assert_eq!(n.nodes(), &list[..]);
            assert_eq!(NodeId::for_role(n.role(), n.rank()), Some(n.me().id));
            assert_eq!((n.num_servers(), n.num_workers()), (2, 3));
        }
        // No task ids: ranks follow (host, port); the join helper advertises 40000 + index.
        let ports = |role| nodes.iter().filter(|n| n.role() == role).map(|n| (n.rank(), n.me().port)).collect::<Vec<_>>();
        assert_eq!(ports(Role::Worker), vec![(0, 40000), (1, 40002), (2, 40004)]);
        assert_eq!(ports(Role::Server), vec![(0, 40001), (1, 40003)]);

        // A worker barrier completes only once the last worker arrives.
        let arrived = Arc::new(AtomicUsize::new(0));
        let (servers, workers): (Vec<_>, Vec<_>) = nodes.into_iter().partition(|n| n.role() == Role::Server);
        let workers: Vec<_> = workers.into_iter().map(Arc::new).collect();
        let mut waits = Vec::new();
        for (i, w) in workers.iter().enumerate() {
            let (w, arrived) = (w.clone(), arrived.clone());
            waits.push(tokio::spawn(async move {
                if i == 2 {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                arrived.fetch_add(1, Ordering::SeqCst);
                w.barrier(Group::WORKERS).await.unwrap();
                assert_eq!(arrived.load(Ordering::SeqCst), 3, "released before every worker arrived");
            }));
        }
        for w in waits {
            w.await.unwrap();
        }

        // A global barrier (servers + workers), then shutdown: workers finish, servers are told.
        let servers: Vec<_> = servers.into_iter().map(Arc::new).collect();
        let all = workers.iter().chain(servers.iter()).cloned().map(|n| tokio::spawn(async move { n.barrier(Group::ALL).await }));
        for h in all.collect::<Vec<_>>() {
            h.await.unwrap().unwrap();
        }
        assert!(matches!(servers[0].barrier(Group::WORKERS).await, Err(Error::InvalidArgument(_))));

        let server_waits: Vec<_> = servers
            .into_iter()
            .map(|s| {
                tokio::spawn(async move {
                    s.wait_shutdown().await.unwrap();
                    Arc::into_inner(s).unwrap().close().await;
                })
            })
            .collect();
        let finishes: Vec<_> =
            workers.into_iter().map(|w| tokio::spawn(async move { Arc::into_inner(w).unwrap().finish().await })).collect();
        for f in finishes {
            f.await.unwrap().unwrap();
        }
        for s in server_waits {
            s.await.unwrap();
        }
        sched.handle.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_task_ids_decide_ranks() {
    bounded(async {
        let t = TcpTransport::default();
        let sched = start_scheduler(&t, 1, 3, &[]).await;
        let nodes = join_all(
            &t,
            &sched.config,
            &[(Role::Worker, Some(2)), (Role::Worker, Some(0)), (Role::Server, Some(0)), (Role::Worker, Some(1))],
        )
        .await;
        let ranks: Vec<_> = nodes.iter().map(|n| (n.role(), n.rank())).collect();
        assert_eq!(ranks, vec![(Role::Worker, 2), (Role::Worker, 0), (Role::Server, 0), (Role::Worker, 1)]);
        sched.stop.cancel();
        for n in &nodes {
            n.wait_shutdown().await.unwrap();
        }
        sched.handle.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_node_is_reported_to_every_survivor_with_role_rank_and_address() {
    bounded(async {
        let t = TcpTransport::default();
        let sched = start_scheduler(&t, 1, 3, &[]).await;
        let mut nodes =
            join_all(&t, &sched.config, &[(Role::Server, None), (Role::Worker, None), (Role::Worker, None), (Role::Worker, None)]).await;
        let victim = nodes.remove(2);
        let victim_node = victim.me().clone();
        assert_eq!((victim_node.role, victim_node.rank), (Role::Worker, Some(1)));

        // Worker 0 is waiting at a barrier when worker 1 dies.
        let survivors: Vec<_> = nodes.into_iter().map(Arc::new).collect();
        let waiting = {
            let w = survivors[1].clone();
            tokio::spawn(async move { w.barrier(Group::WORKERS).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let died = Instant::now();
        drop(victim);

        let check = |e: Error| match e {
            Error::LostPeer { node, .. } => {
                assert_eq!(node, victim_node);
                let text = Error::LostPeer { node, reason: String::new() }.to_string();
                assert!(text.contains("worker rank 1") && text.contains("127.0.0.1:40002"), "{text}");
            }
            other => panic!("expected LostPeer, got {other}"),
        };
        check(waiting.await.unwrap().unwrap_err());
        check(survivors[0].wait_shutdown().await.unwrap_err()); // the server
        check(survivors[2].failed().await);
        check(survivors[2].barrier(Group::ALL).await.unwrap_err()); // later waits fail too
        check(survivors[0].check().unwrap_err());
        check(sched.handle.await.unwrap().unwrap_err());
        assert!(died.elapsed() < Duration::from_secs(1), "reported after {:?}", died.elapsed());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_and_surplus_registrations_are_refused_without_disturbing_the_cluster() {
    bounded(async {
        let t = TcpTransport::default();
        let sched = start_scheduler(&t, 1, 1, &[]).await;
        let nodes = join_all(&t, &sched.config, &[(Role::Server, None), (Role::Worker, None)]).await;
        let late = synkv::ps::Cluster::join(&t, &sched.config.for_node(Role::Worker, None), 1, Default::default()).await;
        match late {
            Err(Error::Remote { message, .. }) => assert!(message.contains("already formed"), "{message}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let mut it = nodes.into_iter();
        let (server, worker) = (it.next().unwrap(), it.next().unwrap());
        let s = tokio::spawn(async move { server.wait_shutdown().await });
        worker.finish().await.unwrap();
        s.await.unwrap().unwrap();
        sched.handle.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surplus_worker_during_rendezvous_is_refused() {
    bounded(async {
        let t = TcpTransport::default();
        let sched = start_scheduler(&t, 1, 1, &[]).await;
        let first = {
            let (t, c) = (t.clone(), sched.config.for_node(Role::Worker, None));
            tokio::spawn(async move { synkv::ps::Cluster::join(&t, &c, 1, Default::default()).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = synkv::ps::Cluster::join(&t, &sched.config.for_node(Role::Worker, None), 2, Default::default()).await;
        match second {
            Err(Error::Remote { message, .. }) => assert!(message.contains("DMLC_NUM_WORKER=1"), "{message}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let server = join_all(&t, &sched.config, &[(Role::Server, None)]).await.pop().unwrap();
        let worker = first.await.unwrap().unwrap();
        worker.finish().await.unwrap();
        server.wait_shutdown().await.unwrap();
        sched.handle.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_rendezvous_times_out_everywhere() {
    bounded(async {
        let t = TcpTransport::default();
        let sched = start_scheduler(&t, 1, 2, &[("SYNKV_TIMEOUT_MS", "600")]).await;
        let joined = synkv::ps::Cluster::join(&t, &sched.config.for_node(Role::Worker, None), 1, Default::default()).await;
        match joined {
            Err(Error::Remote { message, .. }) => assert!(message.contains("0 of 1 servers and 1 of 2 workers"), "{message}"),
            other => panic!("expected the scheduler's timeout, got {other:?}"),
        }
        match sched.handle.await.unwrap() {
            Err(Error::Timeout { what, .. }) => assert!(what.contains("rendezvous"), "{what}"),
            other => panic!("expected a timeout, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_without_a_scheduler_times_out() {
    bounded(async {
        let t = TcpTransport::default();
        // Bind then drop to get a port nobody listens on.
        let port = {
            use synkv::ps::{Listener, Transport};
            let l = t.bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().rsplit_once(':').unwrap().1.parse::<u16>().unwrap()
        };
        let cfg = dist_util::config(port, 1, 1, &[("DMLC_ROLE", "worker"), ("SYNKV_TIMEOUT_MS", "300")]);
        let started = Instant::now();
        let e = synkv::ps::Cluster::join(&t, &cfg, 1, Default::default()).await.unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
    })
    .await;
}

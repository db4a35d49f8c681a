//! Authentication on real sockets: a shared secret admits nodes; a wrong, missing or
//! unexpected secret is refused before it changes any scheduler state, and never leaks.

mod dist_util;

use dist_util::{bounded, join_all, start_scheduler};
use synkv::ps::proto::{Command, Message};
use synkv::ps::{auth, AuthError, Cluster, Error, Node, Role, TcpTransport, Transport};

const SECRET: &str = "correct-horse-battery-staple";

fn assert_no_secret(e: &Error) {
    for text in [e.to_string(), format!("{e:?}")] {
        assert!(!text.contains(SECRET) && !text.contains("wrong-horse"), "secret leaked: {text}");
    }
}

async fn join_as(t: &TcpTransport, cfg: &synkv::ps::Config, secret: Option<&str>) -> synkv::ps::Result<Cluster> {
    let mut cfg = cfg.for_node(Role::Worker, None);
    cfg.secret = secret.and_then(synkv::ps::Secret::new);
    Cluster::join(t, &cfg, 7, Default::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_secret_admits_and_others_are_refused_without_state_change() {
    bounded(async {
        let t = TcpTransport::default();
        let sched = start_scheduler(&t, 1, 1, &[("SYNKV_SECRET", SECRET)]).await;

        // Refused attempts first: had any of them registered, the real worker below would be
        // refused as surplus (DMLC_NUM_WORKER=1).
        let wrong = join_as(&t, &sched.config, Some("wrong-horse")).await.unwrap_err();
        assert!(matches!(wrong, Error::Auth(AuthError::Rejected { .. })), "{wrong}");
        assert_no_secret(&wrong);
        let missing = join_as(&t, &sched.config, None).await.unwrap_err();
        assert!(matches!(missing, Error::Auth(AuthError::SecretMissing { .. })), "{missing}");
        assert!(missing.to_string().contains("SYNKV_SECRET"));
        assert_no_secret(&missing);

        let nodes = join_all(&t, &sched.config, &[(Role::Server, None), (Role::Worker, None)]).await;
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
async fn a_secret_facing_an_open_scheduler_is_an_error() {
    bounded(async {
        let t = TcpTransport::default();
        let sched = start_scheduler(&t, 1, 1, &[]).await;
        let e = join_as(&t, &sched.config, Some(SECRET)).await.unwrap_err();
        assert!(matches!(e, Error::Auth(AuthError::PeerUnauthenticated { .. })), "{e}");
        assert_no_secret(&e);
        sched.stop.cancel();
        sched.handle.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_a_role_other_than_the_authenticated_one_is_refused() {
    bounded(async {
        let t = TcpTransport::default();
        let sched = start_scheduler(&t, 1, 1, &[("SYNKV_SECRET", SECRET)]).await;
        let secret = synkv::ps::Secret::new(SECRET).unwrap();
        let mut conn = t.connect(&sched.config.root_addr()).await.unwrap();
        let me = auth::Identity::new(Role::Worker, synkv::ps::NodeId::NONE);
        auth::connect(&mut conn, Some(&secret), me, Role::Scheduler, std::time::Duration::from_secs(5)).await.unwrap();
        conn.write_message(&Message::register(Node::unassigned(Role::Server, "127.0.0.1", 9, None))).await.unwrap();
        let reply = conn.read_message().await.unwrap().unwrap();
        assert_eq!(reply.command, Command::Error);
        assert!(reply.meta.text.contains("authenticated as worker"), "{}", reply.meta.text);
        assert!(conn.read_message().await.unwrap().is_none(), "connection closed after the refusal");
        sched.stop.cancel();
        sched.handle.await.unwrap().unwrap();
    })
    .await;
}

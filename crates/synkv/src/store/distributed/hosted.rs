//! The scheduler and server a worker process hosts when an orchestrator (torchrun, Slurm,
//! MPI…) started it: `Config::placement` says which (the rule is in `ps::orchestrator`).
//!
//! [`Hosted::start`] binds each role's listener first, so a busy port fails the store's
//! creation with that error, then runs the role on its own small runtime (threads
//! `synkv-sched`, `synkv-server`), before this process's worker joins. Configurations are
//! the worker's, for the role: `for_node(Role::Scheduler, None)`, `for_node(Role::Server,
//! None)` (the scheduler numbers the servers).
//!
//! Addresses: a loopback host (one node) is bound as is; any other host is advertised as given
//! but bound on the wildcard address (as torch's own store does), because a name may resolve
//! differently on its own machine (`127.0.1.1`) or be a Kubernetes service name; set
//! `SYNKV_SECRET` on shared networks.
//!
//! The roles outlive this process's worker: other workers may still be training. They end
//! when the scheduler ends the job (every worker finished, or a node died), and report how on a
//! channel; [`Hosted::wait`], called by the store's `close` after its worker has finished,
//! waits for that (bounded) and returns the first role's error. Dropping a [`Hosted`] stops
//! the roles at once; runtimes are always shut down in the background, which is safe inside
//! another runtime.

use std::future::Future;
use std::time::Duration;

use tokio::runtime::{Handle, Runtime};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::block;
use crate::ps::transport::share::InProcess;
use crate::ps::transport::Listener;
use crate::ps::{Config, Error as DistError, Placement, Role, Scheduler, Server, TcpTransport, Transport};

/// A role's end: which, and how.
type Ended = (Role, Result<(), DistError>);

/// The roles this process hosts.
pub(super) struct Hosted {
    /// One runtime per role, in start order.
    runtimes: Vec<Runtime>,
    /// Their tasks (aborted on drop).
    tasks: Vec<JoinHandle<()>>,
    /// The roles started, in order.
    roles: Vec<Role>,
    /// Each role sends its outcome here when it ends; a task that panicked sends nothing, and
    /// the channel closes once every task is gone.
    ended_tx: Option<mpsc::UnboundedSender<Ended>>,
    ended: mpsc::UnboundedReceiver<Ended>,
    /// Outcomes received so far.
    outcomes: Vec<Ended>,
    /// Cancelled to stop every role (the scheduler then tells every node to shut down).
    stop: CancellationToken,
    /// How long [`Hosted::wait`] waits for the job to end before stopping the roles.
    bound: Duration,
    /// How long the roles then have to stop.
    grace: Duration,
    /// The hosted server, marked as this process's own: this process's worker reaches it
    /// through memory, even with `SYNKV_SHM=0` (`ps/transport/share.rs`).
    _in_process: Option<InProcess>,
}

/// The address to bind for a role advertised at `host` (module docs).
fn listen_addr(host: &str, port: u16) -> String {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_loopback() => {
            if ip.is_ipv6() {
                format!("[{bare}]:{port}")
            } else {
                format!("{bare}:{port}")
            }
        }
        Ok(std::net::IpAddr::V6(_)) => format!("[::]:{port}"),
        _ if bare.eq_ignore_ascii_case("localhost") => format!("127.0.0.1:{port}"),
        _ => format!("0.0.0.0:{port}"),
    }
}

/// A bind failure, saying which role, where and what to change.
fn bind_error(role: Role, addr: &str, e: DistError, fix: &str) -> DistError {
    match e {
        DistError::Io(io) => {
            DistError::Io(std::io::Error::new(io.kind(), format!("the {role} this process hosts could not listen on {addr}: {io}; {fix}")))
        }
        other => other,
    }
}

/// The error of a role that ended without an outcome (its task panicked or was dropped).
fn vanished(role: Role) -> DistError {
    DistError::Shutdown(format!("the {role} this process hosted stopped without a result (it panicked)"))
}

impl Hosted {
    /// Starts what `placement` names (nothing: `None`).
    pub(super) fn start(config: &Config, placement: &Placement) -> Result<Option<Hosted>, DistError> {
        if !placement.scheduler && !placement.server {
            return Ok(None);
        }
        let (ended_tx, ended) = mpsc::unbounded_channel();
        let mut hosted = Hosted {
            runtimes: Vec::new(),
            tasks: Vec::new(),
            roles: Vec::new(),
            ended_tx: Some(ended_tx),
            ended,
            outcomes: Vec::new(),
            stop: CancellationToken::new(),
            bound: config.timeout + config.heartbeat_timeout,
            grace: config.heartbeat_timeout,
            _in_process: None,
        };
        // On an error, dropping `hosted` stops what was started.
        if placement.scheduler {
            let cfg = config.for_node(Role::Scheduler, None);
            let addr = listen_addr(&cfg.root_uri, cfg.root_port);
            cfg.check_listen(&cfg.root_uri).map_err(crate::ps::Error::from)?;
            let rt = hosted.runtime("synkv-sched")?;
            let transport = TcpTransport::for_config(&cfg);
            let listener = block(&rt, transport.bind(&addr))
                .map_err(|e| bind_error(Role::Scheduler, &addr, e, "another job may use the port: set SYNKV_ROOT_PORT to a free one"))?;
            let stop = hosted.stop.child_token();
            hosted.spawn(&rt, Role::Scheduler, Scheduler::new(cfg).run(listener, stop));
        }
        if placement.server {
            let cfg = Config { port: None, ..config.for_node(Role::Server, None) };
            let addr = listen_addr(&cfg.node_host, 0);
            cfg.check_listen(&cfg.node_host).map_err(crate::ps::Error::from)?;
            let rt = hosted.runtime("synkv-server")?;
            let transport = TcpTransport::for_config(&cfg);
            let listener = block(&rt, transport.bind(&addr))
                .map_err(|e| bind_error(Role::Server, &addr, e, "set SYNKV_NODE_HOST to an address of this machine"))?;
            let port = listener.local_addr()?.rsplit_once(':').and_then(|(_, p)| p.parse().ok());
            hosted._in_process = port.map(|p| InProcess::mark(&cfg.node_host, p));
            let stop = hosted.stop.child_token();
            hosted.spawn(&rt, Role::Server, async move { Server::new(cfg).run(&transport, listener, stop).await });
        }
        // Only the tasks hold senders now: the channel closes when they are all gone.
        hosted.ended_tx = None;
        Ok(Some(hosted))
    }

    /// A two-thread runtime, kept in `self` (so a later error drops it safely).
    fn runtime(&mut self, thread_name: &str) -> Result<Handle, DistError> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name(thread_name).enable_all().build()?;
        let handle = rt.handle().clone();
        self.runtimes.push(rt);
        Ok(handle)
    }

    /// Runs `role` on `rt`, reporting its outcome on the `ended` channel.
    fn spawn(&mut self, rt: &Handle, role: Role, run: impl Future<Output = Result<(), DistError>> + Send + 'static) {
        let Some(tx) = self.ended_tx.clone() else { return };
        self.tasks.push(rt.spawn(async move {
            let _ = tx.send((role, run.await));
        }));
        self.roles.push(role);
    }

    /// Resolves when a hosted role has failed, with its error (raced against the worker's
    /// start-up, so a role that cannot join fails the store's creation at once). Roles that
    /// end well are noted; if every role has ended well, it never resolves.
    pub(super) async fn failure(&mut self) -> DistError {
        loop {
            match self.ended.recv().await {
                Some((role, Err(e))) => {
                    self.outcomes.push((role, Err(DistError::Shutdown(format!("the {role} failed: {e}")))));
                    return e;
                }
                Some(ok) => self.outcomes.push(ok),
                None => match self.roles.iter().find(|r| !self.outcomes.iter().any(|(o, _)| o == *r)) {
                    Some(role) => return vanished(*role),
                    None => std::future::pending::<()>().await,
                },
            }
        }
    }

    /// Waits until every hosted role has ended (the job is over), within `bound`; past it the
    /// roles are stopped and given `grace`. Returns the first role's error (scheduler first).
    pub(super) fn wait(mut self) -> Result<(), DistError> {
        let Some(handle) = self.runtimes.first().map(|rt| rt.handle().clone()) else { return Ok(()) };
        let (bound, grace, stop) = (self.bound, self.grace, self.stop.clone());
        let (roles, ended, outcomes) = (&self.roles, &mut self.ended, &mut self.outcomes);
        block(&handle, async move {
            let mut deadline = tokio::time::Instant::now() + bound;
            let mut stopped = false;
            while outcomes.len() < roles.len() {
                match tokio::time::timeout_at(deadline, ended.recv()).await {
                    Ok(Some(outcome)) => outcomes.push(outcome),
                    Ok(None) => break,
                    Err(_) if !stopped => {
                        tracing::warn!("the roles this process hosts have not ended {bound:?} after its worker finished; stopping them");
                        stop.cancel();
                        stopped = true;
                        deadline = tokio::time::Instant::now() + grace;
                    }
                    Err(_) => break,
                }
            }
        });
        while let Ok(outcome) = self.ended.try_recv() {
            self.outcomes.push(outcome);
        }
        let mut first = None;
        for role in &self.roles {
            let result = match self.outcomes.iter().position(|(r, _)| r == role) {
                Some(i) => self.outcomes.swap_remove(i).1,
                None if self.ended.is_closed() => Err(vanished(*role)),
                None => Err(DistError::timeout(format!("the {role} this process hosts to end"), bound + grace)),
            };
            if let Err(e) = result {
                tracing::error!("the {role} this process hosted failed: {e}");
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Hosted {
    fn drop(&mut self) {
        self.stop.cancel();
        for task in self.tasks.drain(..) {
            task.abort();
        }
        for rt in self.runtimes.drain(..) {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::{listen_addr, Hosted};
    use crate::ps::{Config, Error as DistError, TcpTransport, Worker};

    /// Rank `rank` of `world` torchrun-style processes on this node, scheduler at 127.0.0.1:`port`.
    fn config(rank: u32, world: u32, port: u16, servers: u32) -> Config {
        let vars = [
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", world.to_string()),
            ("LOCAL_RANK", rank.to_string()),
            ("LOCAL_WORLD_SIZE", world.to_string()),
            ("SYNKV_ROOT_PORT", port.to_string()),
            ("SYNKV_NUM_SERVERS", servers.to_string()),
            ("SYNKV_HEARTBEAT_INTERVAL_MS", "100".to_owned()),
            ("SYNKV_HEARTBEAT_TIMEOUT_MS", "1000".to_owned()),
            ("SYNKV_TIMEOUT_MS", "500".to_owned()),
        ];
        Config::from_worker_map(vars, None).expect("a valid configuration")
    }

    fn free_port() -> u16 {
        crate::ps::transport::ports::free_port("127.0.0.1").expect("a free port")
    }

    #[test]
    fn loopback_is_bound_as_is_and_other_hosts_on_the_wildcard() {
        assert_eq!(listen_addr("127.0.0.1", 5), "127.0.0.1:5");
        assert_eq!(listen_addr("::1", 5), "[::1]:5");
        assert_eq!(listen_addr("[::1]", 5), "[::1]:5");
        assert_eq!(listen_addr("localhost", 5), "127.0.0.1:5");
        assert_eq!(listen_addr("node01", 0), "0.0.0.0:0");
        assert_eq!(listen_addr("10.0.0.7", 9), "0.0.0.0:9");
        assert_eq!(listen_addr("fe80::1", 9), "[::]:9");
    }

    #[test]
    fn a_busy_port_fails_the_start_and_says_what_to_set() {
        let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let port = busy.local_addr().expect("its address").port();
        let c = config(0, 1, port, 1);
        let placement = c.placement.expect("a placement");
        let e = Hosted::start(&c, &placement).err().expect("a bind error");
        let msg = e.to_string();
        assert!(matches!(e, DistError::Io(_)), "{e:?}");
        assert!(msg.contains(&format!("could not listen on 127.0.0.1:{port}")) && msg.contains("SYNKV_ROOT_PORT"), "{msg}");
    }

    #[test]
    fn nothing_to_host_starts_nothing() {
        let c = config(1, 2, free_port(), 1);
        let placement = c.placement.expect("a placement");
        assert!(!placement.scheduler && !placement.server);
        assert!(Hosted::start(&c, &placement).expect("no error").is_none());
    }

    #[test]
    fn a_role_that_cannot_join_is_reported_at_once() {
        // Rank 1 hosts the second server; nobody runs the scheduler: its join times out (500 ms).
        let c = config(1, 2, free_port(), 2);
        let placement = c.placement.expect("a placement");
        assert!(placement.server && !placement.scheduler);
        let mut hosted = Hosted::start(&c, &placement).expect("started").expect("a role");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let e = rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), hosted.failure()).await }).expect("reported in time");
        assert!(matches!(e, DistError::Timeout { .. }), "{e:?}");
        drop(hosted);
    }

    #[test]
    fn the_roles_end_with_the_job_and_wait_returns_ok() {
        // A one-process job: this "process" hosts the scheduler and the server.
        let c = config(0, 1, free_port(), 1);
        let placement = c.placement.expect("a placement");
        let hosted = Hosted::start(&c, &placement).expect("started").expect("roles");
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
        rt.block_on(async {
            let transport = TcpTransport::new(c.limits);
            let worker = Worker::connect(&transport, &c, CancellationToken::new()).await.expect("joined");
            assert_eq!((worker.rank(), worker.num_servers()), (0, 1));
            worker.finish().await.expect("finished");
        });
        hosted.wait().expect("the hosted roles ended cleanly");
        rt.shutdown_background();
    }
}

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
//! when the scheduler ends the job (every worker finished, or a node died); [`Hosted::wait`],
//! called by the store's `close` after its worker has finished, waits for that (bounded) and
//! returns the first role's error. Dropping a [`Hosted`] stops the roles at once; runtimes are
//! always shut down in the background, which is safe inside another runtime.

use std::future::Future;
use std::time::Duration;

use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::block;
use crate::ps::{Config, Error as DistError, Placement, Role, Scheduler, Server, TcpTransport, Transport};

/// One hosted role: its runtime and its task.
struct HostedRole {
    role: Role,
    rt: Option<Runtime>,
    task: Option<JoinHandle<Result<(), DistError>>>,
}

/// The roles this process hosts.
pub(super) struct Hosted {
    roles: Vec<HostedRole>,
    /// Cancelled to stop every role (the scheduler then tells every node to shut down).
    stop: CancellationToken,
    /// Cancelled when a role ended with an error.
    failed: CancellationToken,
    /// How long [`Hosted::wait`] waits for the job to end before stopping the roles.
    bound: Duration,
    /// How long the roles then have to stop.
    grace: Duration,
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

/// Ends the role's task, noting a failure in `failed`.
async fn watched(failed: CancellationToken, role: impl Future<Output = Result<(), DistError>>) -> Result<(), DistError> {
    let result = role.await;
    if result.is_err() {
        failed.cancel();
    }
    result
}

/// A role's task outcome as a role result.
fn outcome(role: Role, joined: Result<Result<(), DistError>, tokio::task::JoinError>) -> Result<(), DistError> {
    match joined {
        Ok(r) => r,
        Err(e) => Err(DistError::Shutdown(format!("the {role} this process hosted stopped: {e}"))),
    }
}

impl Hosted {
    /// Starts what `placement` names (nothing: `None`).
    pub(super) fn start(config: &Config, placement: &Placement) -> Result<Option<Hosted>, DistError> {
        if !placement.scheduler && !placement.server {
            return Ok(None);
        }
        let mut hosted = Hosted {
            roles: Vec::new(),
            stop: CancellationToken::new(),
            failed: CancellationToken::new(),
            bound: config.timeout + config.heartbeat_timeout,
            grace: config.heartbeat_timeout,
        };
        // On an error, dropping `hosted` stops what was started.
        if placement.scheduler {
            let cfg = config.for_node(Role::Scheduler, None);
            let addr = listen_addr(&cfg.root_uri, cfg.root_port);
            let rt = hosted.runtime(Role::Scheduler, "synkv-sched")?;
            let transport = TcpTransport::new(cfg.limits);
            let listener = block(&rt, transport.bind(&addr))
                .map_err(|e| bind_error(Role::Scheduler, &addr, e, "another job may use the port: set SYNKV_ROOT_PORT to a free one"))?;
            let task = rt.spawn(watched(hosted.failed.clone(), Scheduler::new(cfg).run(listener, hosted.stop.child_token())));
            hosted.set_task(task);
        }
        if placement.server {
            let cfg = Config { port: None, ..config.for_node(Role::Server, None) };
            let addr = listen_addr(&cfg.node_host, 0);
            let rt = hosted.runtime(Role::Server, "synkv-server")?;
            let transport = TcpTransport::new(cfg.limits);
            let listener = block(&rt, transport.bind(&addr))
                .map_err(|e| bind_error(Role::Server, &addr, e, "set SYNKV_NODE_HOST to an address of this machine"))?;
            let stop = hosted.stop.child_token();
            let task = rt.spawn(watched(hosted.failed.clone(), async move { Server::new(cfg).run(&transport, listener, stop).await }));
            hosted.set_task(task);
        }
        Ok(Some(hosted))
    }

    /// A two-thread runtime for `role`, kept in `self.roles` (so a later error drops it safely).
    fn runtime(&mut self, role: Role, thread_name: &str) -> Result<Handle, DistError> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name(thread_name).enable_all().build()?;
        let handle = rt.handle().clone();
        self.roles.push(HostedRole { role, rt: Some(rt), task: None });
        Ok(handle)
    }

    fn set_task(&mut self, task: JoinHandle<Result<(), DistError>>) {
        if let Some(r) = self.roles.last_mut() {
            r.task = Some(task);
        }
    }

    /// Resolves when a hosted role has failed, with its error (raced against the worker's
    /// start-up, so a role that cannot join fails the store's creation at once).
    pub(super) async fn failure(&mut self) -> DistError {
        self.failed.cancelled().await;
        for r in &mut self.roles {
            if !r.task.as_ref().is_some_and(JoinHandle::is_finished) {
                continue;
            }
            if let Some(task) = r.task.take() {
                if let Err(e) = outcome(r.role, task.await) {
                    return e;
                }
            }
        }
        DistError::Shutdown("a role this process hosted failed".to_owned())
    }

    /// Waits until every hosted role has ended (the job is over), within `bound`; past it the
    /// roles are stopped and given `grace`. Returns the first role's error.
    pub(super) fn wait(mut self) -> Result<(), DistError> {
        let mut first = None;
        for r in &mut self.roles {
            let (Some(mut task), Some(rt)) = (r.task.take(), r.rt.as_ref()) else { continue };
            let (bound, grace, stop, role) = (self.bound, self.grace, self.stop.clone(), r.role);
            let result = block(rt.handle(), async move {
                if let Ok(joined) = tokio::time::timeout(bound, &mut task).await {
                    return outcome(role, joined);
                }
                tracing::warn!("the {role} this process hosts has not ended {bound:?} after its worker finished; stopping it");
                stop.cancel();
                match tokio::time::timeout(grace, &mut task).await {
                    Ok(joined) => outcome(role, joined),
                    Err(_) => {
                        task.abort();
                        Err(DistError::timeout(format!("the {role} this process hosts to end"), bound + grace))
                    }
                }
            });
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
        for r in &mut self.roles {
            if let Some(task) = r.task.take() {
                task.abort();
            }
            if let Some(rt) = r.rt.take() {
                rt.shutdown_background();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::listen_addr;

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
}

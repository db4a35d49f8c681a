//! [`Scheduler`]: rendezvous, ranks, barriers, heartbeats, failure detection and shutdown.
//!
//! The scheduler listens at `DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT`. Every connection first runs
//! the [`auth`](crate::ps::auth) handshake, then must send `Register` (role, advertised
//! `host:port`, optional `DMLC_TASK_ID`). When all `DMLC_NUM_SERVER` servers and
//! `DMLC_NUM_WORKER` workers are registered, ranks are assigned (rule in `ranks.rs`: complete
//! task ids win, else (host, port) order) and every node receives the node list. A rendezvous
//! that does not complete within `SYNKV_TIMEOUT_MS` fails everyone with a timeout.
//!
//! Afterwards the scheduler answers heartbeats and releases barriers. A node that closes its
//! connection without having finished, or is silent for `SYNKV_HEARTBEAT_TIMEOUT_MS`, is
//! declared dead: every survivor receives `NodeDead` naming it (role, rank, `host:port`) and
//! [`Scheduler::run`] returns [`Error::LostPeer`]. When every worker has sent `Shutdown`,
//! every node is told `Shutdown` and `run` returns `Ok`.
//!
//! Structure (mini-redis's shape): an accept loop spawns one task per connection
//! (`conn.rs`), all tracked; connection tasks feed events to a single core task (`core.rs`)
//! that owns the state and never awaits. Connections beyond the expected nodes plus a small
//! slack wait for a permit, so a flood of rogue connections cannot exhaust the process.

mod conn;
mod core;
pub(crate) use self::core::REJOIN;
mod ranks;

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::conn::ConnTask;
use self::core::{Core, Outcome};
use super::transport::{accept_loop, Gate, Listener, Transport, HANDSHAKE_DEADLINE};
use super::{Config, Error, Result};

/// Connections allowed in the handshake at once beyond the expected node count.
const CONNECTION_SLACK: u32 = 64;

/// The cluster coordinator (ps-lite's scheduler node).
#[derive(Debug)]
pub struct Scheduler {
    config: Config,
}

impl Scheduler {
    /// A scheduler for the cluster described by `config` (its role is not checked).
    pub fn new(config: Config) -> Scheduler {
        Scheduler { config }
    }

    /// Binds `DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT` on `transport`, then [`run`](Scheduler::run)s.
    pub async fn serve<T: Transport>(self, transport: &T, shutdown: CancellationToken) -> Result<()> {
        self.config.check_listen(&self.config.root_uri)?;
        let listener = transport.bind(&self.config.root_addr()).await?;
        self.run(listener, shutdown).await
    }

    /// Runs until every worker is done (`Ok`), a node dies ([`Error::LostPeer`]), the
    /// rendezvous times out ([`Error::Timeout`]) or `shutdown` is cancelled (every node is
    /// told to shut down; `Ok`). Returns only after its connection tasks have finished
    /// (each bounded by the heartbeat timeout).
    pub async fn run<L: Listener>(self, listener: L, shutdown: CancellationToken) -> Result<()> {
        crate::ps::metrics::start(crate::ps::Role::Scheduler);
        let config = self.config;
        crate::ps::trace::start(crate::ps::Role::Scheduler, 0, &config.trace);
        // Independent of `shutdown`, so final messages are flushed before connections close;
        // the guards cancel both if this future is dropped.
        let accept_stop = CancellationToken::new();
        let conns = CancellationToken::new();
        let _guards = (accept_stop.clone().drop_guard(), conns.clone().drop_guard());
        let tracker = TaskTracker::new();
        let (events_tx, mut events) = mpsc::channel(1024);
        let established = usize::try_from(config.num_nodes() + CONNECTION_SLACK).unwrap_or(usize::MAX);
        let gate = Gate::new(established, HANDSHAKE_DEADLINE.min(config.heartbeat_timeout));
        tracing::info!(
            "scheduler at {} waiting for {} servers and {} workers",
            listener.local_addr().unwrap_or_default(),
            config.num_servers,
            config.num_workers
        );

        let (conn_token, conn_tracker, accept_config) = (conns.clone(), tracker.clone(), config.clone());
        tracker.spawn(accept_loop(listener, gate, accept_stop.clone(), move |id, conn, _peer, pending| {
            let task = ConnTask {
                id,
                conn,
                config: accept_config.clone(),
                events: events_tx.clone(),
                token: conn_token.child_token(),
                tracker: conn_tracker.clone(),
            };
            conn_tracker.spawn(task.run(pending));
        }));

        let mut core = Core::new(config.clone(), Instant::now());
        let mut tick = tokio::time::interval((config.heartbeat_interval / 2).max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let result = loop {
            let outcome = tokio::select! {
                () = shutdown.cancelled() => core.on_stop(),
                ev = events.recv() => match ev {
                    Some(ev) => core.on_event(ev, Instant::now()),
                    None => Outcome::Done(Err(Error::Shutdown("every connection task ended".into()))),
                },
                _ = tick.tick() => core.on_tick(Instant::now()),
            };
            if let Outcome::Done(result) = outcome {
                break result;
            }
        };

        // Stop accepting; let writers flush the final messages and close; then stop the rest.
        accept_stop.cancel();
        core.close_all();
        tracker.close();
        let drained = tokio::time::timeout(config.heartbeat_timeout, async {
            // Connection tasks may still report events; keep the channel drained.
            loop {
                tokio::select! {
                    () = tracker.wait() => break,
                    ev = events.recv() => if ev.is_none() { tracker.wait().await; break },
                }
            }
        });
        if drained.await.is_err() {
            tracing::warn!("connections did not close within {:?}; dropping them", config.heartbeat_timeout);
        }
        conns.cancel();
        tracker.wait().await;
        if let Err(e) = &result {
            crate::ps::trace::dump_error(crate::ps::Role::Scheduler, e);
        }
        crate::ps::trace::finish(crate::ps::Role::Scheduler);
        result
    }
}

//! `synkv scheduler` and `synkv server`: run one cluster role from the `DMLC_*` environment
//! until the job ends.
//!
//! Each builds a small tokio runtime, reads `ps::Config` once, and runs the library's
//! [`Scheduler`] or [`Server`] with a shutdown token that Ctrl-C (SIGINT) or SIGTERM cancels.
//! The exit status is 0 when every worker finished (clean shutdown) and 1 otherwise, with the
//! error — e.g. the dead node, by role, rank and address — printed by `main`.

use anyhow::{bail, Context, Result};
use synkv::ps::{Config, Role, Scheduler, Server, TcpTransport};
use tokio_util::sync::CancellationToken;

/// Which role to run.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RoleCommand {
    Scheduler,
    Server,
}

pub(crate) fn run(which: RoleCommand) -> Result<()> {
    let wanted = match which {
        RoleCommand::Scheduler => Role::Scheduler,
        RoleCommand::Server => Role::Server,
    };
    let config = Config::from_env().context("reading the cluster configuration from the environment")?;
    // DMLC_ROLE unset reads as "worker" (MXNet's rule); the subcommand names the role here.
    let role_var = std::env::var("DMLC_ROLE").ok();
    if role_var.is_some() && config.role != wanted {
        bail!("DMLC_ROLE={} but `synkv {wanted}` runs the {wanted}; unset DMLC_ROLE or set it to {wanted}", config.role);
    }
    let config = config.for_node(wanted, config.task_id);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("synkv").enable_all().build()?;
    rt.block_on(async move {
        let stop = CancellationToken::new();
        tokio::spawn(cancel_on_signal(stop.clone()));
        let transport = TcpTransport::for_config(&config);
        match which {
            RoleCommand::Scheduler => Scheduler::new(config).serve(&transport, stop).await?,
            RoleCommand::Server => Server::new(config).serve(&transport, stop).await?,
        }
        Ok(())
    })
}

/// Cancels `stop` on SIGINT or SIGTERM.
pub(crate) async fn cancel_on_signal(stop: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                stop.cancel();
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    stop.cancel();
}

//! [`accept_loop`]: the one accept loop every listening role runs (scheduler, server).
//!
//! Each connection needs a pending place from the listener's [`Gate`], taken *before*
//! `accept`: while every place is held the loop stops accepting, the kernel's backlog fills,
//! and a flood of connections cannot exhaust the process. A connection from an address that
//! already has its share of pending connections is closed at once. The [`Pending`] place is
//! handed to the caller's handler with the connection; the handler runs the handshake within
//! [`Pending::deadline`] and then trades it for an established place
//! ([`Pending::establish`]). A failed `accept` (e.g. out of file descriptors) is logged and
//! retried after a short pause.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::gate::{Gate, Pending};
use super::{Connection, Listener};

/// Pause after a failed `accept` before the next one.
const RETRY: Duration = Duration::from_millis(100);

/// Accepts connections on `listener` until `stop` is cancelled, calling `handle(id, conn,
/// peer address, pending place)` for each (ids count from 1). Run it as a task.
pub async fn accept_loop<L, H>(mut listener: L, gate: Arc<Gate>, stop: CancellationToken, mut handle: H)
where
    L: Listener,
    H: FnMut(u64, Connection, String, Pending) + Send,
{
    let mut next_id = 0u64;
    loop {
        let permit = tokio::select! {
            p = gate.reserve() => match p { Some(p) => p, None => return },
            () = stop.cancelled() => return,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stop.cancelled() => return,
        };
        match accepted {
            Ok((conn, peer)) => match gate.admit(&peer, permit) {
                Some(pending) => {
                    next_id += 1;
                    tracing::debug!("connection {next_id} from {peer}");
                    handle(next_id, conn, peer, pending);
                }
                None => tracing::warn!("closing a connection from {peer}: too many connections from its address are authenticating"),
            },
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                drop(permit);
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

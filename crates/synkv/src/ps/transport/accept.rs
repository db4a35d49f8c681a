//! [`accept_loop`]: the one accept loop every listening role runs (scheduler, server).
//!
//! Each connection needs a permit from a semaphore sized by the caller (the expected peers
//! plus a slack), taken *before* `accept`: while every permit is held the loop stops
//! accepting, the kernel's backlog fills, and a flood of connections cannot exhaust the
//! process. The permit is handed to the caller's handler with the connection and must live as
//! long as the connection's task. A failed `accept` (e.g. out of file descriptors) is logged
//! and retried after a short pause.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::{Connection, Listener};

/// Pause after a failed `accept` before the next one.
const RETRY: Duration = Duration::from_millis(100);

/// Accepts connections on `listener` until `stop` is cancelled, calling `handle(id, conn,
/// peer address, permit)` for each (ids count from 1). Run it as a task.
pub async fn accept_loop<L, H>(mut listener: L, permits: Arc<Semaphore>, stop: CancellationToken, mut handle: H)
where
    L: Listener,
    H: FnMut(u64, Connection, String, OwnedSemaphorePermit) + Send,
{
    let mut next_id = 0u64;
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&permits).acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            () = stop.cancelled() => return,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stop.cancelled() => return,
        };
        match accepted {
            Ok((conn, peer)) => {
                next_id += 1;
                tracing::debug!("connection {next_id} from {peer}");
                handle(next_id, conn, peer, permit);
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                drop(permit);
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

//! [`Gate`]: how many connections a listener holds, before and after they authenticate.
//!
//! A connection is *pending* from `accept` until its handshake succeeds, and *established*
//! after. Pending connections are bounded on their own — in total, and per peer address — and
//! each must finish its handshake within [`Gate::handshake_deadline`], so idle or slow
//! connections from someone without the secret cannot take the places of the cluster's nodes:
//! at worst they delay a node's connection by the deadline (nodes retry). The accept loop takes
//! a pending place *before* `accept`, so while all are taken the kernel's backlog fills instead
//! of the process. A connection over its address's bound is closed at once.
//!
//! Established connections are bounded by the cluster's size plus a slack; a connection that
//! authenticates when all are taken is refused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Most connections pending their handshake at once, from everywhere.
pub const PENDING_TOTAL: usize = 64;
/// Most connections pending their handshake at once from one address.
pub const PENDING_PER_PEER: usize = 16;
/// The longest a handshake may take (shorter if the heartbeat timeout is).
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// A listener's connection bounds (cheap to share).
#[derive(Debug)]
pub struct Gate {
    pending: Arc<Semaphore>,
    per_peer: usize,
    by_peer: Mutex<HashMap<String, usize>>,
    established: Arc<Semaphore>,
    deadline: Duration,
}

impl Gate {
    /// A gate for `established` authenticated connections, with handshakes bounded by
    /// `deadline`.
    pub fn new(established: usize, deadline: Duration) -> Arc<Gate> {
        Gate::with_bounds(established, PENDING_TOTAL, PENDING_PER_PEER, deadline)
    }

    /// A gate with explicit bounds (tests).
    pub fn with_bounds(established: usize, pending: usize, per_peer: usize, deadline: Duration) -> Arc<Gate> {
        Arc::new(Gate {
            pending: Arc::new(Semaphore::new(pending.max(1))),
            per_peer: per_peer.max(1),
            by_peer: Mutex::default(),
            established: Arc::new(Semaphore::new(established.max(1))),
            deadline,
        })
    }

    /// How long a new connection has to finish its handshake.
    pub fn handshake_deadline(&self) -> Duration {
        self.deadline
    }

    /// Waits for a pending place (`None`: the gate was closed).
    pub(super) async fn reserve(self: &Arc<Gate>) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.pending).acquire_owned().await.ok()
    }

    /// Admits a connection from `peer` (`host:port`) as pending, or `None` when its address
    /// already has its bound of pending connections.
    pub(super) fn admit(self: &Arc<Gate>, peer: &str, permit: OwnedSemaphorePermit) -> Option<Pending> {
        let host = peer_host(peer).to_owned();
        let mut by_peer = self.by_peer.lock().unwrap_or_else(PoisonError::into_inner);
        let count = by_peer.entry(host.clone()).or_default();
        if *count >= self.per_peer {
            return None;
        }
        *count += 1;
        Some(Pending { gate: Arc::clone(self), host, _permit: permit })
    }

    /// Connections pending now (tests and diagnostics).
    pub fn pending(&self) -> usize {
        self.by_peer.lock().unwrap_or_else(PoisonError::into_inner).values().sum()
    }
}

/// The host part of `host:port` (`[v6]:port` included).
fn peer_host(peer: &str) -> &str {
    match peer.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => peer,
    }
}

/// A connection's place while it authenticates; returned when dropped.
#[derive(Debug)]
pub struct Pending {
    gate: Arc<Gate>,
    host: String,
    _permit: OwnedSemaphorePermit,
}

impl Pending {
    /// The handshake succeeded: trades this place for an established one, or `None` when the
    /// listener already holds its bound of established connections.
    pub fn establish(self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.gate.established).try_acquire_owned().ok()
    }

    /// How long the handshake may take.
    pub fn deadline(&self) -> Duration {
        self.gate.deadline
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut by_peer = self.gate.by_peer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = by_peer.get_mut(&self.host) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                by_peer.remove(&self.host);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pending_places_are_bounded_per_peer_and_returned_when_dropped() {
        let gate = Gate::with_bounds(2, 8, 2, Duration::from_secs(1));
        let a1 = gate.admit("10.0.0.1:5000", gate.reserve().await.unwrap()).unwrap();
        let _a2 = gate.admit("10.0.0.1:5001", gate.reserve().await.unwrap()).unwrap();
        assert!(gate.admit("10.0.0.1:5002", gate.reserve().await.unwrap()).is_none(), "third from one address");
        let _b = gate.admit("10.0.0.2:5000", gate.reserve().await.unwrap()).unwrap();
        assert_eq!(gate.pending(), 3);
        drop(a1);
        assert_eq!(gate.pending(), 2);
        assert!(gate.admit("10.0.0.1:5003", gate.reserve().await.unwrap()).is_some());
        assert_eq!(peer_host("[::1]:80"), "[::1]");
    }

    #[tokio::test]
    async fn established_places_are_bounded_and_pending_ones_bound_the_total() {
        let gate = Gate::with_bounds(1, 2, 8, Duration::from_secs(1));
        let p1 = gate.admit("h:1", gate.reserve().await.unwrap()).unwrap();
        let p2 = gate.admit("h:2", gate.reserve().await.unwrap()).unwrap();
        let third = tokio::time::timeout(Duration::from_millis(50), gate.reserve()).await;
        assert!(third.is_err(), "no third pending place: accept waits");
        let held = p1.establish().expect("one established place");
        assert!(p2.establish().is_none(), "the second is refused");
        assert!(gate.reserve().await.is_some(), "both pending places returned");
        drop(held);
    }
}

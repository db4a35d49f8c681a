//! [`Error`]: what can go wrong in the distributed layer, and [`AuthError`]/[`ConfigError`].
//!
//! Messages name the node (role, rank, `host:port`), what was awaited and for how long, or the
//! variable and its accepted form. No variant ever holds the shared secret or a MAC.

use std::time::Duration;

use super::node::Node;
use super::proto::{Command, DecodeError, EncodeError, ErrorCode};

/// A distributed-layer error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A socket operation failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A peer closed its connection in the middle of a frame.
    #[error("{peer} closed the connection in the middle of a frame ({buffered} bytes buffered)")]
    EofMidFrame {
        /// Who (address or node description).
        peer: String,
        /// Bytes of the partial frame.
        buffered: usize,
    },
    /// A node died or stopped answering; every pending and later wait fails with this.
    #[error("lost {node}: {reason}")]
    LostPeer {
        /// The node, with role, rank and address.
        node: Node,
        /// Why it was declared dead (disconnect, heartbeat timeout…).
        reason: String,
    },
    /// A blocking wait ran out of time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long we waited.
        after: Duration,
    },
    /// Authentication failed (never contains the secret).
    #[error("authentication failed: {0}")]
    Auth(#[from] AuthError),
    /// A peer sent a frame we refuse; its connection is closed.
    #[error("protocol error from {peer}: {source}")]
    Protocol {
        /// Who sent it.
        peer: String,
        /// The rule it broke.
        source: DecodeError,
    },
    /// We tried to send a message that breaks the frame limits.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// A well-formed message that makes no sense at this point of the protocol.
    #[error("unexpected {command:?} from {peer}: {detail}")]
    Unexpected {
        /// Who sent it.
        peer: String,
        /// Its command.
        command: Command,
        /// What we expected instead.
        detail: String,
    },
    /// A peer reported an error for one of our requests.
    #[error("{node} reported: {message}")]
    Remote {
        /// The reporting node.
        node: Node,
        /// Its message.
        message: String,
    },
    /// A server refused a data request or command; nothing it holds changed.
    #[error("{node} refused the request: {message}")]
    Refused {
        /// The server.
        node: Node,
        /// Why, as a code (the store turns it back into its typed error).
        code: ErrorCode,
        /// Why, in words (names the key and the fix).
        message: String,
        /// The key part (ps key, offset) it is about, when the server named one.
        key: Option<(u64, u64)>,
    },
    /// A configuration variable is missing or malformed.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An API was used in a way the cluster cannot honour (e.g. a barrier of a group this
    /// node is not in).
    #[error("invalid use: {0}")]
    InvalidArgument(String),
    /// This component is shutting down; the operation was abandoned.
    #[error("shutting down: {0}")]
    Shutdown(String),
}

/// Why an authentication handshake failed. Holds no secret material.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The peer requires authentication but `SYNKV_SECRET` is not set here.
    #[error("{peer} requires authentication but SYNKV_SECRET is not set on this node; set the same SYNKV_SECRET on every node")]
    SecretMissing {
        /// The peer.
        peer: String,
    },
    /// `SYNKV_SECRET` is set here but the peer does not authenticate.
    #[error("SYNKV_SECRET is set on this node but {peer} does not require authentication; set the same SYNKV_SECRET on every node")]
    PeerUnauthenticated {
        /// The peer.
        peer: String,
    },
    /// The peer's handshake did not prove it holds our secret.
    #[error("{peer} failed the handshake (wrong or missing SYNKV_SECRET)")]
    Refused {
        /// The peer.
        peer: String,
    },
    /// The peer refused our response.
    #[error("{peer} refused our credentials (SYNKV_SECRET differs between nodes)")]
    Rejected {
        /// The peer.
        peer: String,
    },
    /// The handshake broke off or did not follow the protocol.
    #[error("handshake with {peer} failed: {detail}")]
    Handshake {
        /// The peer.
        peer: String,
        /// What happened.
        detail: String,
    },
    /// A frame after the handshake failed its integrity check (changed, replayed, reordered
    /// or forged on the way); the connection is closed.
    #[error("a frame from {peer} failed its integrity check (changed on the way, replayed or forged); closing the connection")]
    Integrity {
        /// The peer.
        peer: String,
    },
    /// The peer claims an identity its connection may not speak for.
    #[error("{peer} claims {claim}, which its connection may not speak for")]
    Identity {
        /// The peer.
        peer: String,
        /// What it claimed and why that is refused.
        claim: String,
    },
}

/// A missing or malformed configuration variable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {problem}; expected {expected}")]
pub struct ConfigError {
    /// The environment variable.
    pub var: &'static str,
    /// What is wrong (the value is quoted, except for secrets).
    pub problem: String,
    /// The accepted form.
    pub expected: &'static str,
}

impl Error {
    /// A [`Error::Timeout`].
    pub fn timeout(what: impl Into<String>, after: Duration) -> Error {
        Error::Timeout { what: what.into(), after }
    }

    /// A [`Error::Protocol`] from `peer`.
    pub fn protocol(peer: impl Into<String>, source: DecodeError) -> Error {
        Error::Protocol { peer: peer.into(), source }
    }
}

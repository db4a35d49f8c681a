//! Constructors and checked accessors for the control messages (rendezvous, barrier,
//! heartbeat, failure, shutdown, authentication), so no caller builds them field by field.
//!
//! Accessors validate the command-specific shape (e.g. `Register` carries exactly one node)
//! and return [`DecodeError`] for anything else; they never panic on peer input.

use bytes::Bytes;

use super::header::Command;
use super::message::{Chunk, DTypeCode, Message};
use super::{DecodeError, ErrorCode};
use crate::ps::node::{Group, Node, NodeId, Role};

/// Length of authentication nonces and MACs.
pub(crate) const TOKEN_LEN: usize = 32;

impl Message {
    /// `Register`: `node` (unassigned) asks to join.
    pub fn register(node: Node) -> Message {
        let mut m = Message::new(Command::Register);
        m.meta.nodes.push(node);
        m
    }

    /// `NodeList`: the whole cluster, sent to the node with id `recipient`.
    pub fn node_list(nodes: Vec<Node>, recipient: NodeId) -> Message {
        let mut m = Message::new(Command::NodeList).with_sender(NodeId::SCHEDULER);
        m.meta.nodes = nodes;
        m.meta.head = i32::try_from(recipient.0).unwrap_or(-1);
        m
    }

    /// `Barrier` over `group`, numbered `request_id` by the sender.
    pub fn barrier(group: Group, request_id: u64) -> Message {
        let mut m = Message::new(Command::Barrier).with_request_id(request_id);
        m.meta.head = group.bits().into();
        m
    }

    /// `BarrierRelease` answering the `Barrier` numbered `request_id`.
    pub fn barrier_release(group: Group, request_id: u64) -> Message {
        let mut m = Message::new(Command::BarrierRelease).with_sender(NodeId::SCHEDULER).with_request_id(request_id);
        m.meta.head = group.bits().into();
        m
    }

    /// `NodeDead`: `node` is gone, for `reason`.
    pub fn node_dead(node: Node, reason: &str) -> Message {
        let mut m = Message::new(Command::NodeDead).with_sender(NodeId::SCHEDULER);
        m.meta.nodes.push(node);
        m.meta.text = reason.to_owned();
        m
    }

    /// `Failover`: server `node` died and its partitions moved to their backups.
    pub fn failover(node: Node, reason: &str) -> Message {
        let mut m = Message::new(Command::Failover).with_sender(NodeId::SCHEDULER);
        m.meta.nodes.push(node);
        m.meta.text = reason.to_owned();
        m
    }

    /// `WorkerAway` or `WorkerBack` (`command`) about `node`.
    pub fn worker_moved(command: Command, node: Node) -> Message {
        let mut m = Message::new(command).with_sender(NodeId::SCHEDULER);
        m.meta.nodes.push(node);
        m
    }

    /// `Error` answering request `request_id` (code [`ErrorCode::Other`]).
    pub fn error(request_id: u64, text: impl Into<String>) -> Message {
        Message::coded_error(request_id, ErrorCode::Other, text)
    }

    /// `Error` answering request `request_id`, of kind `code` (in `head`).
    pub fn coded_error(request_id: u64, code: ErrorCode, text: impl Into<String>) -> Message {
        let mut m = Message::new(Command::Error).with_request_id(request_id);
        m.meta.head = code.code();
        m.meta.text = text.into();
        m
    }

    /// The kind of an `Error` (unknown codes read as [`ErrorCode::Other`]).
    pub fn error_code(&self) -> ErrorCode {
        ErrorCode::from_code(self.meta.head)
    }

    /// `Notice`: `text`, worth logging on the receiving side.
    pub fn notice(text: impl Into<String>) -> Message {
        let mut m = Message::new(Command::Notice);
        m.meta.text = text.into();
        m
    }

    /// `NodeDone`: worker `node` finished.
    pub fn node_done(node: Node) -> Message {
        let mut m = Message::new(Command::NodeDone).with_sender(NodeId::SCHEDULER);
        m.meta.nodes.push(node);
        m
    }

    /// `Challenge` carrying a random nonce.
    pub fn challenge(nonce: [u8; TOKEN_LEN]) -> Message {
        let mut m = Message::new(Command::Challenge);
        m.chunks.push(Chunk::bytes(Bytes::copy_from_slice(&nonce)));
        m
    }

    /// `ChallengeResponse` from a node of `role` carrying `mac`.
    pub fn challenge_response(role: Role, mac: [u8; TOKEN_LEN]) -> Message {
        let mut m = Message::new(Command::ChallengeResponse);
        m.meta.head = role.code().into();
        m.chunks.push(Chunk::bytes(Bytes::copy_from_slice(&mac)));
        m
    }

    /// `ServerCommand` number `id` (spec K8.13) with an opaque `body`.
    pub fn server_command(id: i32, body: Bytes) -> Message {
        let mut m = Message::new(Command::ServerCommand);
        m.meta.head = id;
        m.chunks.push(Chunk::bytes(body));
        m
    }

    /// The single node of a `Register`, `NodeDead`, `NodeDone` or `Failover`.
    pub fn single_node(&self) -> Result<&Node, DecodeError> {
        match self.meta.nodes.as_slice() {
            [node] => Ok(node),
            nodes => {
                Err(DecodeError::InvalidField { field: "node count (expected 1)", value: u64::try_from(nodes.len()).unwrap_or(u64::MAX) })
            }
        }
    }

    /// The barrier group in `head`.
    pub fn group(&self) -> Result<Group, DecodeError> {
        Group::try_from(self.meta.head)
            .map_err(|bits| DecodeError::InvalidField { field: "barrier group", value: u64::from(bits.unsigned_abs()) })
    }

    /// The role code in `head` (a `ChallengeResponse`).
    pub fn head_role(&self) -> Result<Role, DecodeError> {
        let code = u8::try_from(self.meta.head).map_err(|_| DecodeError::UnknownRole(u8::MAX))?;
        Role::try_from(code).map_err(|_| DecodeError::UnknownRole(code))
    }

    /// The 32-byte token in the only chunk (a `Challenge` or `ChallengeResponse`).
    pub fn token(&self) -> Result<[u8; TOKEN_LEN], DecodeError> {
        match self.chunks.as_slice() {
            [Chunk { dtype: DTypeCode::U8, data }] if data.len() == TOKEN_LEN => {
                let mut out = [0u8; TOKEN_LEN];
                out.copy_from_slice(data);
                Ok(out)
            }
            _ => Err(DecodeError::InvalidField { field: "authentication token (expected one 32-byte chunk)", value: 0 }),
        }
    }

    /// The node id in `head` (the recipient of a `NodeList`).
    pub fn head_node_id(&self) -> Result<NodeId, DecodeError> {
        u32::try_from(self.meta.head)
            .map(NodeId)
            .map_err(|_| DecodeError::InvalidField { field: "recipient id", value: u64::from(self.meta.head.unsigned_abs()) })
    }
}

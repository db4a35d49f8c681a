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

/// Longest handshake message a `Hello` or `Welcome` may carry.
pub(crate) const HANDSHAKE_LEN_MAX: usize = 1024;

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

    /// `Hello` from a node of `role`, carrying the first handshake message (empty: no secret).
    pub fn hello(role: Role, handshake: &[u8]) -> Message {
        let mut m = Message::new(Command::Hello);
        m.meta.head = role.code().into();
        if !handshake.is_empty() {
            m.chunks.push(Chunk::bytes(Bytes::copy_from_slice(handshake)));
        }
        m
    }

    /// `Welcome` carrying the second handshake message.
    pub fn welcome(handshake: &[u8]) -> Message {
        let mut m = Message::new(Command::Welcome);
        m.chunks.push(Chunk::bytes(Bytes::copy_from_slice(handshake)));
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

    /// The role code in `head` (a `Hello`).
    pub fn head_role(&self) -> Result<Role, DecodeError> {
        let code = u8::try_from(self.meta.head).map_err(|_| DecodeError::UnknownRole(u8::MAX))?;
        Role::try_from(code).map_err(|_| DecodeError::UnknownRole(code))
    }

    /// The handshake message in the only chunk of a `Hello` or `Welcome` (`None`: no chunk, a
    /// `Hello` without a secret).
    pub fn handshake(&self) -> Result<Option<&[u8]>, DecodeError> {
        match self.chunks.as_slice() {
            [] => Ok(None),
            [Chunk { dtype: DTypeCode::U8, data }] if data.len() <= HANDSHAKE_LEN_MAX => Ok(Some(data)),
            _ => Err(DecodeError::InvalidField { field: "handshake message (expected one chunk of at most 1 KiB)", value: 0 }),
        }
    }

    /// The node id in `head` (the recipient of a `NodeList`).
    pub fn head_node_id(&self) -> Result<NodeId, DecodeError> {
        u32::try_from(self.meta.head)
            .map(NodeId)
            .map_err(|_| DecodeError::InvalidField { field: "recipient id", value: u64::from(self.meta.head.unsigned_abs()) })
    }
}

//! The handshake every connection starts with: mutual authentication from the cluster's shared
//! secret, the connector's identity bound to the connection, and session keys that seal every
//! later frame (`transport/seal.rs`).
//!
//! With a [`Secret`] both ends run the Noise pattern `NNpsk0` (`snow`; X25519, ChaCha20-Poly1305,
//! BLAKE2s) with a pre-shared key derived from the secret:
//! 1. connector → acceptor: `Hello` (role in `head`, Noise message 1 in chunk 0, whose encrypted
//!    payload is the connector's identity: role and node id);
//! 2. acceptor → connector: `Welcome` (Noise message 2, payload: the acceptor's identity);
//! 3. connector → acceptor: `AuthOk`, the first sealed frame.
//!
//! Message 1 only opens with the same secret, so a peer without it (or with another) is refused
//! before anything it sends is acted on. Message 2 mixes both ephemeral keys, so only a holder
//! of the secret can answer it (a fake scheduler or server is refused by the connector), and
//! the session keys are fresh per connection: a recorded handshake replayed later yields keys
//! the replayer does not have, so its confirmation fails. Every frame after the handshake is
//! sealed under those keys with a counter, so a changed, injected, replayed or reordered frame
//! closes the connection.
//!
//! Without a secret (allowed only on loopback addresses or with `SYNKV_INSECURE=1`, see
//! [`Config`](super::Config)) the connector sends a bare `Hello` and the acceptor answers
//! `AuthOk`; frames are not sealed. Both sides must agree: a connector without a secret facing
//! a secured acceptor fails with [`AuthError::SecretMissing`], one with a secret facing an open
//! acceptor with [`AuthError::PeerUnauthenticated`]. The secret never appears in logs, errors or
//! `Debug`.
//!
//! Not protected: the secret is shared, so every node holding it is trusted alike (a node can
//! claim any identity its role allows at its own handshake; the acceptor checks the claim
//! against the cluster and then holds the connection to it). See `docs/security.md`.

use std::fmt;
use std::time::Duration;

use super::node::{NodeId, Role};
use super::proto::{Command, Limits, Message};
use super::transport::{Connection, Seal};
use super::{AuthError, Error, Result};

/// The Noise protocol every secured connection runs.
const NOISE: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// Bound into the handshake transcript: both ends speak this protocol version.
const PROLOGUE: &[u8] = b"synkv handshake v4";
/// Derives the Noise pre-shared key from the secret (BLAKE3's key derivation).
const PSK_CONTEXT: &str = "synkv 2026-12 SYNKV_SECRET to Noise PSK v1";
/// A Noise message is at most this long.
const NOISE_MAX: usize = 65535;
/// Secrets shorter than this are worth warning about: a recorded handshake lets anyone guess
/// them offline (the launchers generate 64 hex digits).
pub const WEAK_SECRET_LEN: usize = 32;

/// The cluster's shared secret (`SYNKV_SECRET`). Its `Debug` output is redacted and it has no
/// `Display`, so it cannot leak through formatting.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Box<[u8]>);

impl Secret {
    /// A secret from raw bytes; `None` if empty.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Option<Secret> {
        let bytes = bytes.into();
        (!bytes.is_empty()).then(|| Secret(bytes.into_boxed_slice()))
    }

    /// A fresh random 256-bit secret, as 64 hex digits (what the launchers hand to a job).
    pub fn generate() -> std::io::Result<String> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(format!("no randomness for a job secret: {e}")))?;
        Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Whether the secret is short enough to be guessed offline from a recorded handshake.
    pub fn is_weak(&self) -> bool {
        self.0.len() < WEAK_SECRET_LEN
    }

    fn psk(&self) -> [u8; 32] {
        blake3::derive_key(PSK_CONTEXT, &self.0)
    }

    fn noise(&self, initiator: bool) -> Result<snow::HandshakeState> {
        let psk = self.psk();
        let params: snow::params::NoiseParams = NOISE.parse().map_err(|e| noise_error("the protocol name", e))?;
        let builder = snow::Builder::new(params).prologue(PROLOGUE).and_then(|b| b.psk(0, &psk)).map_err(|e| noise_error("set-up", e))?;
        let built = if initiator { builder.build_initiator() } else { builder.build_responder() };
        built.map_err(|e| noise_error("set-up", e))
    }
}

fn noise_error(what: &str, e: snow::Error) -> Error {
    Error::Io(std::io::Error::other(format!("Noise {what} failed: {e}")))
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Who a node says it is at its handshake: its role and node id ([`NodeId::NONE`] before the
/// scheduler assigned one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The role.
    pub role: Role,
    /// The node id.
    pub id: NodeId,
}

impl Identity {
    /// A node of `role` with id `id`.
    pub fn new(role: Role, id: NodeId) -> Identity {
        Identity { role, id }
    }

    fn encode(self) -> [u8; 5] {
        let mut out = [0u8; 5];
        out[0] = self.role.code();
        out[1..].copy_from_slice(&self.id.0.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Identity> {
        let [role, a, b, c, d] = bytes else { return None };
        let role = Role::try_from(*role).ok()?;
        Some(Identity { role, id: NodeId(u32::from_le_bytes([*a, *b, *c, *d])) })
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.id.role_rank() {
            Some((_, rank)) if self.role != Role::Scheduler => write!(f, "{} rank {rank}", self.role),
            _ if self.id == NodeId::NONE => write!(f, "an unregistered {}", self.role),
            _ => write!(f, "{} (node id {})", self.role, self.id),
        }
    }
}

async fn read_within(conn: &mut Connection, timeout: Duration) -> Result<Option<Message>> {
    let what = format!("authentication handshake with {}", conn.peer());
    tokio::time::timeout(timeout, conn.read_message()).await.map_err(|_| Error::timeout(what, timeout))?
}

fn handshake(conn: &Connection, detail: impl Into<String>) -> Error {
    AuthError::Handshake { peer: conn.peer().to_owned(), detail: detail.into() }.into()
}

/// The acceptor closed the connection without a word: it may hold its bound of connections
/// pending authentication; worth another try ([`retryable`]).
fn closed(conn: &Connection) -> Error {
    handshake(conn, "the peer closed the connection during the handshake (it may be busy with other connections)")
}

/// Whether a failed connection attempt is worth repeating: the peer was unreachable, busy or
/// cut the handshake short. A refused secret or identity is final.
pub fn retryable(e: &Error) -> bool {
    matches!(e, Error::Io(_) | Error::EofMidFrame { .. } | Error::Auth(AuthError::Handshake { .. }))
}

/// Acceptor side: `me` is this node's identity (told to the connector). Returns the identity
/// the connector proved (with a secret; the connection is sealed from then on) or `None` (no
/// secret configured). Frames are capped at [`Limits::HANDSHAKE_FRAME_BYTES`] meanwhile.
pub async fn accept(conn: &mut Connection, secret: Option<&Secret>, me: Identity, timeout: Duration) -> Result<Option<Identity>> {
    let limits = conn.limits();
    conn.set_limits(limits.capped(Limits::HANDSHAKE_FRAME_BYTES));
    let result = accept_inner(conn, secret, me, timeout).await;
    conn.set_limits(limits);
    if let Err(e) = &result {
        if let Error::Protocol { source, .. } = e {
            // Best effort: the peer learns why before we close.
            let _ = tokio::time::timeout(timeout, conn.write_message(&Message::error(0, format!("malformed frame: {source}")))).await;
        }
        tracing::warn!(peer = conn.peer(), "refusing connection: {e}");
    }
    result
}

async fn accept_inner(conn: &mut Connection, secret: Option<&Secret>, me: Identity, timeout: Duration) -> Result<Option<Identity>> {
    let hello = match read_within(conn, timeout).await? {
        Some(m) if m.command == Command::Hello => m,
        Some(m) => return Err(handshake(conn, format!("expected Hello, got {:?}", m.command))),
        None => return Err(handshake(conn, "peer closed the connection before greeting")),
    };
    let role = hello.head_role().map_err(|e| Error::protocol(conn.peer(), e))?;
    let first = hello.handshake().map_err(|e| Error::protocol(conn.peer(), e))?;
    let (secret, first) = match (secret, first) {
        (None, _) => {
            // Open: a connector holding a secret refuses this answer itself.
            conn.write_message(&Message::new(Command::AuthOk)).await?;
            return Ok(None);
        }
        (Some(_), None) => {
            let _ = conn.write_message(&Message::error(0, "authentication required: set SYNKV_SECRET")).await;
            return Err(AuthError::Refused { peer: conn.peer().to_owned() }.into());
        }
        (Some(secret), Some(first)) => (secret, first),
    };
    let mut noise = secret.noise(false)?;
    let mut payload = vec![0u8; NOISE_MAX];
    let claim = match noise.read_message(first, &mut payload) {
        Ok(n) => Identity::decode(&payload[..n]),
        Err(_) => {
            // Best effort: the peer learns why before we close.
            let _ = conn.write_message(&Message::error(0, "authentication failed")).await;
            return Err(AuthError::Refused { peer: conn.peer().to_owned() }.into());
        }
    };
    let claim = match claim {
        Some(claim) if claim.role == role => claim,
        _ => return Err(handshake(conn, "the Hello's identity is malformed or names another role than its header")),
    };
    let n = noise.write_message(&me.encode(), &mut payload).map_err(|e| noise_error("message 2", e))?;
    conn.write_message(&Message::welcome(&payload[..n])).await?;
    conn.set_seal(Seal::from_handshake(noise).map_err(|e| noise_error("split", e))?);
    match read_within(conn, timeout).await {
        Ok(Some(m)) if m.command == Command::AuthOk => Ok(Some(claim)),
        Ok(Some(m)) => Err(handshake(conn, format!("expected the sealed AuthOk, got {:?}", m.command))),
        Ok(None) => Err(handshake(conn, "peer closed the connection before confirming the handshake")),
        // A replayed Hello ends here: the replayer cannot seal the confirmation.
        Err(Error::Auth(AuthError::Integrity { .. })) => Err(AuthError::Refused { peer: conn.peer().to_owned() }.into()),
        Err(e) => Err(e),
    }
}

/// Connects to `node` on `transport` and authenticates as `me`, all within `config.timeout`
/// (`what` names the connection in the timeout error). The acceptor must prove it is a node of
/// `node`'s role.
pub async fn dial<T: super::transport::Transport>(
    transport: &T,
    node: &super::node::Node,
    config: &super::Config,
    me: Identity,
    what: &str,
) -> Result<Connection> {
    let attempt = async || {
        let mut conn = transport.connect(&node.addr()).await?;
        conn.set_peer(node.to_string());
        connect(&mut conn, config.secret.as_ref(), me, node.role, config.heartbeat_timeout).await?;
        Ok::<_, Error>(conn)
    };
    let connected = async {
        let mut backoff = Duration::from_millis(20);
        loop {
            match attempt().await {
                Err(e) if retryable(&e) => {
                    tracing::debug!("connecting to {node} failed, trying again in {backoff:?}: {e}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                done => return done,
            }
        }
    };
    tokio::time::timeout(config.timeout, connected).await.map_err(|_| Error::timeout(format!("{what} {node}"), config.timeout))?
}

/// Connector side, for a node `me`, to an acceptor that must prove it is a `expect`. Frames are
/// capped as in [`accept`]; with a secret the connection is sealed once this returns.
pub async fn connect(conn: &mut Connection, secret: Option<&Secret>, me: Identity, expect: Role, timeout: Duration) -> Result<()> {
    let limits = conn.limits();
    conn.set_limits(limits.capped(Limits::HANDSHAKE_FRAME_BYTES));
    let result = connect_inner(conn, secret, me, expect, timeout).await;
    conn.set_limits(limits);
    result
}

async fn connect_inner(conn: &mut Connection, secret: Option<&Secret>, me: Identity, expect: Role, timeout: Duration) -> Result<()> {
    let Some(secret) = secret else {
        conn.write_message(&Message::hello(me.role, &[])).await?;
        return match read_within(conn, timeout).await {
            Ok(Some(m)) if m.command == Command::AuthOk => Ok(()),
            Ok(Some(m)) if m.command == Command::Error => Err(AuthError::SecretMissing { peer: conn.peer().to_owned() }.into()),
            Ok(Some(m)) => Err(handshake(conn, format!("expected AuthOk, got {:?}", m.command))),
            Ok(None) | Err(Error::Io(_) | Error::EofMidFrame { .. }) => Err(closed(conn)),
            Err(e) => Err(e),
        };
    };
    let mut noise = secret.noise(true)?;
    let mut buf = vec![0u8; NOISE_MAX];
    let n = noise.write_message(&me.encode(), &mut buf).map_err(|e| noise_error("message 1", e))?;
    conn.write_message(&Message::hello(me.role, &buf[..n])).await?;
    let welcome = match read_within(conn, timeout).await {
        Ok(Some(m)) if m.command == Command::Welcome => m,
        Ok(Some(m)) if m.command == Command::AuthOk => return Err(AuthError::PeerUnauthenticated { peer: conn.peer().to_owned() }.into()),
        Ok(Some(m)) if m.command == Command::Error => return Err(AuthError::Rejected { peer: conn.peer().to_owned() }.into()),
        Ok(Some(m)) => return Err(handshake(conn, format!("expected Welcome, got {:?}", m.command))),
        Ok(None) | Err(Error::Io(_) | Error::EofMidFrame { .. }) => return Err(closed(conn)),
        Err(e) => return Err(e),
    };
    let second = welcome.handshake().map_err(|e| Error::protocol(conn.peer(), e))?.unwrap_or_default();
    let them = match noise.read_message(second, &mut buf) {
        Ok(n) => Identity::decode(&buf[..n]),
        // Only a holder of the secret can answer: this one is posing.
        Err(_) => return Err(AuthError::Refused { peer: conn.peer().to_owned() }.into()),
    };
    match them {
        Some(them) if them.role == expect => {}
        Some(them) => {
            return Err(
                AuthError::Identity { peer: conn.peer().to_owned(), claim: format!("to be {them} where a {expect} was expected") }.into()
            )
        }
        None => return Err(handshake(conn, "the Welcome's identity is malformed")),
    }
    conn.set_seal(Seal::from_handshake(noise).map_err(|e| noise_error("split", e))?);
    conn.write_message(&Message::new(Command::AuthOk)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const T: Duration = Duration::from_secs(5);
    const SECRET: &str = "hunter2-very-secret";
    const WORKER: Identity = Identity { role: Role::Worker, id: NodeId(9) };
    const SERVER: Identity = Identity { role: Role::Server, id: NodeId(8) };

    fn pair() -> (Connection, Connection) {
        let (a, b) = tokio::io::duplex(1 << 16);
        (Connection::new(a, "acceptor", Limits::default()), Connection::new(b, "connector", Limits::default()))
    }

    async fn run(acceptor: Option<&str>, connector: Option<&str>) -> (Result<Option<Identity>>, Result<()>) {
        let (mut a, mut c) = pair();
        let sa = acceptor.and_then(Secret::new);
        let sc = connector.and_then(Secret::new);
        let acc = async {
            let r = accept(&mut a, sa.as_ref(), SERVER, T).await;
            drop(a); // close, as the server does after a failure
            r
        };
        let con = async {
            let r = connect(&mut c, sc.as_ref(), WORKER, Role::Server, T).await;
            drop(c);
            r
        };
        tokio::join!(acc, con)
    }

    fn assert_no_secret(e: &Error) {
        for s in [format!("{e}"), format!("{e:?}")] {
            assert!(!s.contains(SECRET) && !s.contains("hunter2"), "secret leaked: {s}");
        }
    }

    #[tokio::test]
    async fn same_secret_is_accepted_identity_bound_and_frames_sealed() {
        let (mut a, mut c) = pair();
        let s = Secret::new(SECRET).unwrap();
        let (who, ok) = tokio::join!(accept(&mut a, Some(&s), SERVER, T), connect(&mut c, Some(&s), WORKER, Role::Server, T));
        assert_eq!(who.unwrap(), Some(WORKER));
        ok.unwrap();
        // Sealed both ways from now on.
        let ping = Message::new(Command::Heartbeat).with_request_id(7);
        c.write_message(&ping).await.unwrap();
        assert_eq!(a.read_message().await.unwrap(), Some(ping.clone()));
        a.write_message(&ping).await.unwrap();
        assert_eq!(c.read_message().await.unwrap(), Some(ping));
    }

    #[tokio::test]
    async fn no_secret_anywhere_is_open() {
        let (a, c) = run(None, None).await;
        assert_eq!(a.unwrap(), None);
        c.unwrap();
    }

    #[tokio::test]
    async fn wrong_secret_is_refused_on_both_sides() {
        let (a, c) = run(Some(SECRET), Some("hunter2-wrong")).await;
        let (a, c) = (a.unwrap_err(), c.unwrap_err());
        assert!(matches!(a, Error::Auth(AuthError::Refused { .. })), "{a}");
        assert!(matches!(c, Error::Auth(AuthError::Rejected { .. })), "{c}");
        assert_no_secret(&a);
        assert_no_secret(&c);
    }

    #[tokio::test]
    async fn connector_without_secret_gets_a_clear_error() {
        let (a, c) = run(Some(SECRET), None).await;
        let c = c.unwrap_err();
        assert!(matches!(c, Error::Auth(AuthError::SecretMissing { .. })), "{c}");
        assert!(c.to_string().contains("SYNKV_SECRET"));
        let a = a.unwrap_err();
        assert_no_secret(&a);
        assert_no_secret(&c);
    }

    #[tokio::test]
    async fn connector_with_secret_refuses_an_open_acceptor() {
        let (_, c) = run(None, Some(SECRET)).await;
        let c = c.unwrap_err();
        assert!(matches!(c, Error::Auth(AuthError::PeerUnauthenticated { .. })), "{c}");
        assert_no_secret(&c);
    }

    /// An acceptor posing as a server (or the scheduler) without the secret: it can read
    /// nothing of the Hello, and whatever it answers does not open.
    #[tokio::test]
    async fn an_acceptor_without_the_secret_cannot_pose_as_a_cluster_node() {
        let (mut fake, mut c) = pair();
        let s = Secret::new(SECRET).unwrap();
        let pose = async {
            let hello = fake.read_message().await.unwrap().unwrap();
            assert_eq!(hello.command, Command::Hello);
            // Answer with a handshake of its own under a guessed secret.
            let mut noise = Secret::new("guess").unwrap().noise(false).unwrap();
            let mut buf = vec![0u8; NOISE_MAX];
            assert!(
                noise.read_message(hello.handshake().unwrap().unwrap(), &mut buf).is_err(),
                "the Hello does not open without the secret"
            );
            let mut other = Secret::new("guess").unwrap().noise(true).unwrap();
            let n = other.write_message(&SERVER.encode(), &mut buf).unwrap();
            fake.write_message(&Message::welcome(&buf[..n])).await.unwrap();
            fake
        };
        let (_fake, r) = tokio::join!(pose, connect(&mut c, Some(&s), WORKER, Role::Server, T));
        let e = r.unwrap_err();
        assert!(matches!(e, Error::Auth(AuthError::Refused { .. })), "{e}");
    }

    #[tokio::test]
    async fn a_node_of_another_role_than_expected_is_refused() {
        let (mut a, mut c) = pair();
        let s = Secret::new(SECRET).unwrap();
        let (_, r) = tokio::join!(accept(&mut a, Some(&s), SERVER, T), connect(&mut c, Some(&s), WORKER, Role::Scheduler, T));
        let e = r.unwrap_err();
        assert!(matches!(e, Error::Auth(AuthError::Identity { .. })), "{e}");
    }

    /// Records the bytes a genuine connector sends, then replays them on a new connection.
    #[tokio::test]
    async fn a_replayed_handshake_is_refused() {
        let s = Secret::new(SECRET).unwrap();
        // The genuine exchange, with the connector's bytes recorded on the way.
        let (acc_io, mid_a) = tokio::io::duplex(1 << 16);
        let (mid_c, con_io) = tokio::io::duplex(1 << 16);
        let mut a = Connection::new(acc_io, "acceptor", Limits::default());
        let mut c = Connection::new(con_io, "connector", Limits::default());
        let (mut mid_a_r, mut mid_a_w) = tokio::io::split(mid_a);
        let (mut mid_c_r, mut mid_c_w) = tokio::io::split(mid_c);
        let recorded = tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 4096];
            loop {
                let n = mid_c_r.read(&mut buf).await.unwrap();
                if n == 0 {
                    return seen;
                }
                seen.extend_from_slice(&buf[..n]);
                mid_a_w.write_all(&buf[..n]).await.unwrap();
            }
        });
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut mid_a_r, &mut mid_c_w).await;
        });
        let (who, ok) = tokio::join!(accept(&mut a, Some(&s), SERVER, T), connect(&mut c, Some(&s), WORKER, Role::Server, T));
        assert_eq!(who.unwrap(), Some(WORKER));
        ok.unwrap();
        drop(c);
        let recorded = recorded.await.unwrap();
        // The replay: the same bytes (Hello, then the sealed AuthOk) on a fresh connection.
        let (acc_io, mut rogue) = tokio::io::duplex(1 << 16);
        let mut a = Connection::new(acc_io, "acceptor", Limits::default());
        rogue.write_all(&recorded).await.unwrap();
        let e = accept(&mut a, Some(&s), SERVER, T).await.unwrap_err();
        assert!(matches!(e, Error::Auth(AuthError::Refused { .. })), "{e}");
    }

    /// A bit flipped in a frame after the handshake closes the connection.
    #[tokio::test]
    async fn a_flipped_bit_after_the_handshake_is_refused() {
        let s = Secret::new(SECRET).unwrap();
        let (acc_io, mid_a) = tokio::io::duplex(1 << 20);
        let (mid_c, con_io) = tokio::io::duplex(1 << 20);
        let mut a = Connection::new(acc_io, "acceptor", Limits::default());
        let mut c = Connection::new(con_io, "connector", Limits::default());
        let (mut mid_a_r, mut mid_a_w) = tokio::io::split(mid_a);
        let (mut mid_c_r, mut mid_c_w) = tokio::io::split(mid_c);
        // Forwards the connector's bytes, flipping one bit of byte number `flip_at`.
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let forwarded = std::sync::Arc::new(AtomicUsize::new(0));
        let flip_at = std::sync::Arc::new(AtomicUsize::new(usize::MAX));
        let (count, at) = (forwarded.clone(), flip_at.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let n = mid_c_r.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                let (total, target) = (count.load(SeqCst), at.load(SeqCst));
                if (total..total + n).contains(&target) {
                    buf[target - total] ^= 0x10;
                }
                if mid_a_w.write_all(&buf[..n]).await.is_err() {
                    return;
                }
                count.fetch_add(n, SeqCst);
            }
        });
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut mid_a_r, &mut mid_c_w).await;
        });
        let (who, ok) = tokio::join!(accept(&mut a, Some(&s), SERVER, T), connect(&mut c, Some(&s), WORKER, Role::Server, T));
        who.unwrap();
        ok.unwrap();
        // A large frame, hashed as it is written; one bit of it changes on the way.
        let mut push = Message::new(Command::Push);
        push.meta.keys = vec![1];
        push.meta.lens = vec![1 << 20];
        push.chunks.push(crate::ps::proto::Chunk::bytes(bytes::Bytes::from(vec![3u8; 1 << 20])));
        c.write_message(&push).await.unwrap();
        assert_eq!(a.read_message().await.unwrap(), Some(push.clone()), "intact frames pass");
        // Everything sent so far was forwarded (the frame and its trailer arrived): flip a bit
        // in the middle of the next frame's tensor bytes.
        flip_at.store(forwarded.load(SeqCst) + 4096, SeqCst);
        c.write_message(&push).await.unwrap();
        let e = a.read_message().await.unwrap_err();
        assert!(matches!(e, Error::Auth(AuthError::Integrity { .. })), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn silent_connector_times_out() {
        let (mut a, _c) = pair();
        let s = Secret::new(SECRET).unwrap();
        let e = accept(&mut a, Some(&s), SERVER, T).await.unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
    }

    #[test]
    fn secret_debug_is_redacted_and_generated_secrets_are_strong() {
        let s = Secret::new(SECRET).unwrap();
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
        assert!(Secret::new("").is_none());
        assert!(s.is_weak());
        let g = Secret::generate().unwrap();
        assert_eq!(g.len(), 64);
        assert!(g.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(g, Secret::generate().unwrap());
        assert!(!Secret::new(g).unwrap().is_weak());
    }

    #[test]
    fn identities_round_trip() {
        for who in [WORKER, SERVER, Identity::new(Role::Scheduler, NodeId::SCHEDULER), Identity::new(Role::Worker, NodeId::NONE)] {
            assert_eq!(Identity::decode(&who.encode()), Some(who));
        }
        assert_eq!(Identity::decode(&[9, 0, 0, 0, 0]), None, "unknown role");
        assert_eq!(Identity::decode(&[1, 0, 0]), None, "short");
    }
}

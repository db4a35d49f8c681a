//! Optional shared-secret authentication, run first on every connection.
//!
//! The acceptor always speaks first:
//! - without a secret it sends `AuthOk` at once (no challenge);
//! - with a [`Secret`] it sends a `Challenge` of 32 random bytes; the connector answers with
//!   `HMAC-SHA256(secret, challenge ‖ role code ‖ "synkv-auth-v1")` and its role in `head`; the
//!   acceptor verifies in constant time (`hmac`'s `verify_slice`) and answers `AuthOk`, or an
//!   `Error` and closes. Nothing the peer sends is acted on before this succeeds.
//!
//! Both sides must agree: a connector without a secret facing a challenge fails with
//! [`AuthError::SecretMissing`]; a connector with a secret greeted by `AuthOk` fails with
//! [`AuthError::PeerUnauthenticated`]. The secret never appears in logs, errors or `Debug`.
//!
//! Not done: mutual authentication (the connector does not verify the acceptor), channel
//! encryption, and wiping the secret from memory on drop.

use std::fmt;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::node::Role;
use super::proto::{Command, Limits, Message};
use super::transport::Connection;
use super::{AuthError, Error, Result};

type HmacSha256 = Hmac<Sha256>;

/// Domain-separation string mixed into every MAC.
const CONTEXT: &[u8] = b"synkv-auth-v1";

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

    fn mac(&self, challenge: &[u8], role: Role) -> HmacSha256 {
        // Not peer input: HMAC accepts keys of any length, so this cannot fail.
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        mac.update(challenge);
        mac.update(&[role.code()]);
        mac.update(CONTEXT);
        mac
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

async fn read_within(conn: &mut Connection, timeout: Duration) -> Result<Option<Message>> {
    let what = format!("authentication handshake with {}", conn.peer());
    tokio::time::timeout(timeout, conn.read_message()).await.map_err(|_| Error::timeout(what, timeout))?
}

fn handshake(conn: &Connection, detail: impl Into<String>) -> Error {
    AuthError::Handshake { peer: conn.peer().to_owned(), detail: detail.into() }.into()
}

/// Acceptor side. Returns the role the peer proved (with a secret) or `None` (no secret).
/// During the handshake frames are capped at [`Limits::HANDSHAKE_FRAME_BYTES`].
pub async fn accept(conn: &mut Connection, secret: Option<&Secret>, timeout: Duration) -> Result<Option<Role>> {
    let limits = conn.limits();
    conn.set_limits(limits.capped(Limits::HANDSHAKE_FRAME_BYTES));
    let result = accept_inner(conn, secret, timeout).await;
    conn.set_limits(limits);
    result
}

async fn accept_inner(conn: &mut Connection, secret: Option<&Secret>, timeout: Duration) -> Result<Option<Role>> {
    let Some(secret) = secret else {
        conn.write_message(&Message::new(Command::AuthOk)).await?;
        return Ok(None);
    };
    let mut nonce = [0u8; 32];
    getrandom::fill(&mut nonce).map_err(|e| Error::Io(std::io::Error::other(format!("no randomness for the challenge: {e}"))))?;
    conn.write_message(&Message::challenge(nonce)).await?;
    let reply = match read_within(conn, timeout).await? {
        Some(m) if m.command == Command::ChallengeResponse => m,
        Some(m) => return Err(handshake(conn, format!("expected ChallengeResponse, got {:?}", m.command))),
        None => return Err(handshake(conn, "peer closed the connection before answering the challenge")),
    };
    let verified = match (reply.head_role(), reply.token()) {
        (Ok(role), Ok(mac)) => secret.mac(&nonce, role).verify_slice(&mac).is_ok().then_some(role),
        _ => None,
    };
    match verified {
        Some(role) => {
            conn.write_message(&Message::new(Command::AuthOk)).await?;
            Ok(Some(role))
        }
        None => {
            tracing::warn!(peer = conn.peer(), "refusing connection: authentication failed");
            // Best effort: the peer learns why before we close.
            let _ = conn.write_message(&Message::error(0, "authentication failed")).await;
            Err(AuthError::Refused { peer: conn.peer().to_owned() }.into())
        }
    }
}

/// Connects to `node` on `transport` and authenticates as `role`, all within
/// `config.timeout` (`what` names the connection in the timeout error).
pub async fn dial<T: super::transport::Transport>(
    transport: &T,
    node: &super::node::Node,
    config: &super::Config,
    role: Role,
    what: &str,
) -> Result<Connection> {
    let connected = async {
        let mut conn = transport.connect(&node.addr()).await?;
        conn.set_peer(node.to_string());
        connect(&mut conn, config.secret.as_ref(), role, config.heartbeat_timeout).await?;
        Ok::<_, Error>(conn)
    };
    tokio::time::timeout(config.timeout, connected).await.map_err(|_| Error::timeout(format!("{what} {node}"), config.timeout))?
}

/// Connector side, for a node of `role`. Frames are capped as in [`accept`].
pub async fn connect(conn: &mut Connection, secret: Option<&Secret>, role: Role, timeout: Duration) -> Result<()> {
    let limits = conn.limits();
    conn.set_limits(limits.capped(Limits::HANDSHAKE_FRAME_BYTES));
    let result = connect_inner(conn, secret, role, timeout).await;
    conn.set_limits(limits);
    result
}

async fn connect_inner(conn: &mut Connection, secret: Option<&Secret>, role: Role, timeout: Duration) -> Result<()> {
    let first = read_within(conn, timeout).await?.ok_or_else(|| handshake(conn, "peer closed the connection before greeting"))?;
    match (first.command, secret) {
        (Command::AuthOk, None) => Ok(()),
        (Command::AuthOk, Some(_)) => Err(AuthError::PeerUnauthenticated { peer: conn.peer().to_owned() }.into()),
        (Command::Challenge, None) => Err(AuthError::SecretMissing { peer: conn.peer().to_owned() }.into()),
        (Command::Challenge, Some(secret)) => {
            let nonce = first.token().map_err(|e| Error::protocol(conn.peer(), e))?;
            let mac: [u8; 32] = secret.mac(&nonce, role).finalize().into_bytes().into();
            conn.write_message(&Message::challenge_response(role, mac)).await?;
            match read_within(conn, timeout).await {
                Ok(Some(m)) if m.command == Command::AuthOk => Ok(()),
                Ok(Some(m)) if m.command != Command::Error => Err(handshake(conn, format!("expected AuthOk, got {:?}", m.command))),
                Ok(_) | Err(Error::Io(_) | Error::EofMidFrame { .. }) => Err(AuthError::Rejected { peer: conn.peer().to_owned() }.into()),
                Err(e) => Err(e),
            }
        }
        (other, _) => Err(handshake(conn, format!("expected Challenge or AuthOk, got {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);
    const SECRET: &str = "hunter2-very-secret";

    fn pair() -> (Connection, Connection) {
        let (a, b) = tokio::io::duplex(4096);
        (Connection::new(a, "acceptor", Limits::default()), Connection::new(b, "connector", Limits::default()))
    }

    async fn run(acceptor: Option<&str>, connector: Option<&str>) -> (Result<Option<Role>>, Result<()>) {
        let (mut a, mut c) = pair();
        let sa = acceptor.and_then(Secret::new);
        let sc = connector.and_then(Secret::new);
        let acc = async {
            let r = accept(&mut a, sa.as_ref(), T).await;
            drop(a); // close, as the scheduler does after a failure
            r
        };
        let con = async {
            let r = connect(&mut c, sc.as_ref(), Role::Worker, T).await;
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
    async fn same_secret_is_accepted_and_role_proved() {
        let (a, c) = run(Some(SECRET), Some(SECRET)).await;
        assert_eq!(a.unwrap(), Some(Role::Worker));
        c.unwrap();
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

    #[tokio::test(start_paused = true)]
    async fn silent_connector_times_out() {
        let (mut a, _c) = pair();
        let s = Secret::new(SECRET).unwrap();
        let e = accept(&mut a, Some(&s), T).await.unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
    }

    #[test]
    fn secret_debug_is_redacted() {
        let s = Secret::new(SECRET).unwrap();
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
        assert!(Secret::new("").is_none());
    }
}

//! [`Client`]: a worker's connections to every server and its outstanding requests (ps-lite's
//! `Customer` + `Van`, as request ids and a tracker).
//!
//! One connection per server, authenticated like every other connection. A writer task per
//! connection drains an outbox; a reader task per connection hands each `Reply`/`Error` to
//! the request waiting for its id. A request is registered before it is queued, so a reply
//! can never arrive for an unknown id; a reply for an id nobody waits for (its waiter timed
//! out) is dropped.
//!
//! Failure: when a server connection breaks, every request waiting on that server fails with
//! [`Error::LostPeer`] naming the server, and so does every later request to it; when the
//! cluster reports a failure (any node dead, or the scheduler gone), every pending and later
//! request fails with it. Every wait has a deadline (`SYNKV_TIMEOUT_MS`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::ps::node::{Node, NodeId, Role};
use crate::ps::proto::{Command, Flags, Message};
use crate::ps::transport::{FrameReader, FrameWriter, Transport};
use crate::ps::{auth, Config, Error, Result};

type Reply = oneshot::Sender<Result<Message>>;

/// Why requests fail from now on; cloneable, unlike [`Error`].
#[derive(Clone, Debug)]
enum Fail {
    Lost { node: Node, reason: String },
    Other(String),
}

impl Fail {
    fn of(e: &Error) -> Fail {
        match e {
            Error::LostPeer { node, reason } => Fail::Lost { node: node.clone(), reason: reason.clone() },
            other => Fail::Other(other.to_string()),
        }
    }

    fn to_error(&self) -> Error {
        match self {
            Fail::Lost { node, reason } => Error::LostPeer { node: node.clone(), reason: reason.clone() },
            Fail::Other(text) => Error::Shutdown(text.clone()),
        }
    }
}

#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, (u32, Reply)>,
    /// A failure of the whole cluster: every request fails with it.
    failure: Option<Fail>,
    /// Servers whose connection broke.
    lost: HashMap<u32, Fail>,
}

struct Inner {
    me: NodeId,
    servers: Vec<(Node, mpsc::UnboundedSender<Message>)>,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    timeout: Duration,
    stop: CancellationToken,
    tracker: TaskTracker,
}

/// A handle on the worker's server connections; cheap to clone into tasks.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("me", &self.inner.me).field("servers", &self.inner.servers.len()).finish_non_exhaustive()
    }
}

/// A request sent and not yet answered.
#[derive(Debug)]
pub struct Waiter {
    rx: oneshot::Receiver<Result<Message>>,
    id: u64,
    server: u32,
    client: Client,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails every request waiting on `server` (or on every server) and every later one.
    fn fail(&self, server: Option<u32>, fail: Fail) {
        let failed: Vec<Reply> = {
            let mut p = self.lock();
            match server {
                Some(s) => {
                    p.lost.entry(s).or_insert_with(|| fail.clone());
                    let ids: Vec<u64> = p.waiting.iter().filter(|(_, (srv, _))| *srv == s).map(|(id, _)| *id).collect();
                    ids.into_iter().filter_map(|id| p.waiting.remove(&id)).map(|(_, r)| r).collect()
                }
                None => {
                    p.failure.get_or_insert_with(|| fail.clone());
                    p.waiting.drain().map(|(_, (_, r))| r).collect()
                }
            }
        };
        for reply in failed {
            let _ = reply.send(Err(fail.to_error()));
        }
    }
}

impl Client {
    /// Connects and authenticates to every server of `servers` (ordered by rank).
    pub(super) async fn connect<T: Transport>(transport: &T, config: &Config, me: NodeId, servers: Vec<Node>) -> Result<Client> {
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        let mut halves = Vec::with_capacity(servers.len());
        for node in &servers {
            let connected = async {
                let mut conn = transport.connect(&node.addr()).await?;
                conn.set_peer(node.to_string());
                auth::connect(&mut conn, config.secret.as_ref(), Role::Worker, config.heartbeat_timeout).await?;
                Ok::<_, Error>(conn)
            };
            let conn = tokio::time::timeout(config.timeout, connected)
                .await
                .map_err(|_| Error::timeout(format!("a connection to {node}"), config.timeout))??;
            halves.push(conn.into_split());
        }
        let mut links = Vec::with_capacity(servers.len());
        let mut readers = Vec::with_capacity(servers.len());
        for (node, (reader, writer)) in servers.into_iter().zip(halves) {
            let (tx, rx) = mpsc::unbounded_channel();
            links.push((node, tx));
            readers.push((reader, writer, rx));
        }
        let inner = Arc::new(Inner {
            me,
            servers: links,
            pending: Mutex::new(Pending::default()),
            next_id: AtomicU64::new(1),
            timeout: config.timeout,
            stop: stop.clone(),
            tracker: tracker.clone(),
        });
        for (i, (reader, writer, rx)) in readers.into_iter().enumerate() {
            let server = u32::try_from(i).unwrap_or(u32::MAX);
            tracker.spawn(read_loop(reader, Arc::clone(&inner), server));
            tracker.spawn(write_loop(writer, rx, Arc::clone(&inner), server));
        }
        Ok(Client { inner })
    }

    /// Fails every pending and later request with `e` (the cluster failed).
    pub(super) fn fail_all(&self, e: &Error) {
        self.inner.fail(None, Fail::of(e));
    }

    /// Stops the connection tasks (pending requests fail with a shutdown error) and waits for
    /// them, bounded by `within`.
    pub(super) async fn close(&self, within: Duration) {
        self.inner.fail(None, Fail::Other("the worker is shutting down".into()));
        self.inner.stop.cancel();
        self.inner.tracker.close();
        let _ = tokio::time::timeout(within, self.inner.tracker.wait()).await;
    }

    /// Number of servers.
    pub fn num_servers(&self) -> u32 {
        u32::try_from(self.inner.servers.len()).unwrap_or(u32::MAX)
    }

    /// The server of rank `server`.
    pub fn server(&self, server: u32) -> Option<&Node> {
        self.inner.servers.get(usize::try_from(server).ok()?).map(|(n, _)| n)
    }

    /// The deadline of one request (`SYNKV_TIMEOUT_MS`).
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Sends `msg` to `server` as a request and returns its waiter. Fails at once if the
    /// cluster or that server is already lost.
    pub fn start(&self, server: u32, mut msg: Message) -> Result<Waiter> {
        let inner = &self.inner;
        let (_, outbox) = inner
            .servers
            .get(usize::try_from(server).unwrap_or(usize::MAX))
            .ok_or_else(|| Error::InvalidArgument(format!("no server of rank {server} ({} servers)", inner.servers.len())))?;
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        msg.request_id = id;
        msg.sender = inner.me;
        msg.flags = msg.flags.with(Flags::REQUEST);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = inner.lock();
            if let Some(f) = p.failure.as_ref().or_else(|| p.lost.get(&server)) {
                return Err(f.to_error());
            }
            p.waiting.insert(id, (server, tx));
        }
        if outbox.send(msg).is_err() {
            inner.lock().waiting.remove(&id);
            return Err(Error::Shutdown("the connection to the server is closed".into()));
        }
        Ok(Waiter { rx, id, server, client: self.clone() })
    }

    /// Sends one request per `(server, message)` and waits for every reply (one deadline for
    /// all). Replies come back in the order of `msgs`.
    pub async fn request_all(&self, msgs: Vec<(u32, Message)>) -> Result<Vec<Message>> {
        let deadline = Instant::now() + self.inner.timeout;
        let mut waiters = Vec::with_capacity(msgs.len());
        for (server, msg) in msgs {
            waiters.push(self.start(server, msg)?);
        }
        let mut out = Vec::with_capacity(waiters.len());
        for w in waiters {
            out.push(w.wait(deadline).await?);
        }
        Ok(out)
    }
}

impl Waiter {
    /// Waits for the reply until `deadline`. An `Error` reply becomes [`Error::Remote`].
    pub async fn wait(self, deadline: Instant) -> Result<Message> {
        let Waiter { rx, id, server, client } = self;
        let node = client.server(server).cloned();
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(Ok(msg))) if msg.command == Command::Error => match node {
                Some(node) => Err(Error::Remote { node, message: msg.meta.text }),
                None => Err(Error::Shutdown(msg.meta.text)),
            },
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::Shutdown("the worker is shutting down".into())),
            Err(_) => {
                client.inner.lock().waiting.remove(&id);
                let what = node.map_or_else(|| format!("server {server}"), |n| n.to_string());
                Err(Error::timeout(
                    format!("a reply from {what} (request {id}); raise SYNKV_TIMEOUT_MS if workers are far apart"),
                    client.inner.timeout,
                ))
            }
        }
    }
}

async fn read_loop(mut reader: FrameReader, inner: Arc<Inner>, server: u32) {
    let reason = loop {
        let read = tokio::select! {
            r = reader.read_message() => r,
            () = inner.stop.cancelled() => return,
        };
        match read {
            Ok(Some(msg)) if matches!(msg.command, Command::Reply | Command::Error) => {
                let waiter = inner.lock().waiting.remove(&msg.request_id);
                match waiter {
                    Some((_, reply)) => {
                        let _ = reply.send(Ok(msg));
                    }
                    None if msg.command == Command::Error => tracing::warn!("{} reported: {}", reader.peer(), msg.meta.text),
                    None => tracing::debug!("late reply {} from {} dropped", msg.request_id, reader.peer()),
                }
            }
            Ok(Some(msg)) if msg.command == Command::NodeDead => match msg.single_node() {
                // The server stops because a node died: fail everything with the real cause.
                Ok(node) => inner.fail(None, Fail::Lost { node: node.clone(), reason: msg.meta.text.clone() }),
                Err(e) => tracing::warn!("malformed NodeDead from {}: {e}", reader.peer()),
            },
            Ok(Some(msg)) => tracing::warn!("ignoring unexpected {:?} from {}", msg.command, reader.peer()),
            Ok(None) => break "connection closed".to_owned(),
            Err(e) => break format!("connection failed: {e}"),
        }
    };
    if inner.stop.is_cancelled() {
        return;
    }
    lose(&inner, server, reason);
}

fn lose(inner: &Inner, server: u32, reason: String) {
    let Some((node, _)) = inner.servers.get(usize::try_from(server).unwrap_or(usize::MAX)) else { return };
    tracing::error!("lost {node}: {reason}");
    inner.fail(Some(server), Fail::Lost { node: node.clone(), reason });
}

async fn write_loop(mut writer: FrameWriter, mut rx: mpsc::UnboundedReceiver<Message>, inner: Arc<Inner>, server: u32) {
    loop {
        let msg = tokio::select! {
            m = rx.recv() => m,
            () = inner.stop.cancelled() => break,
        };
        let Some(msg) = msg else { break };
        let reason = match tokio::time::timeout(inner.timeout, writer.write_message(&msg)).await {
            Ok(Ok(())) => continue,
            Ok(Err(Error::Encode(e))) => {
                // Our own message breaks the limits: fail that request only.
                if let Some((_, reply)) = inner.lock().waiting.remove(&msg.request_id) {
                    let _ = reply.send(Err(Error::Encode(e)));
                }
                continue;
            }
            Ok(Err(e)) => format!("write failed: {e}"),
            Err(_) => format!("write timed out after {:?}", inner.timeout),
        };
        lose(&inner, server, reason);
        return;
    }
    let _ = tokio::time::timeout(inner.timeout, writer.shutdown()).await;
}

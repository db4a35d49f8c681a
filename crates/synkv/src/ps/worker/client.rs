//! [`Client`]: a worker's connections to every server and its outstanding requests (ps-lite's
//! `Customer` + `Van`, as request ids and a tracker).
//!
//! `SYNKV_STREAMS` connections per server (unset: [`LOOPBACK_STREAMS`] to a server on this
//! host reached over TCP, see [`on_this_host`], else one), each authenticated like every other
//! connection; requests to a server take turns on its connections (by request id: the engine
//! orders the operations on one key, so no order between streams is needed), and a break of
//! any one of them is the server's. A writer task per
//! connection drains its outbox ([`drain`]); a reader task per connection hands each
//! `Reply`/`Error` to the request waiting for its id, and logs a server's `Notice` (a sync
//! round waiting for stragglers). A request is registered before it is queued, so a reply can
//! never arrive for an unknown id.
//!
//! Waits: a request waits as long as its server and the cluster are alive — a sync push may
//! wait hours for a slow worker (slow is not dead). It fails only by failure detection: when a
//! server connection breaks (or stops taking bytes for `SYNKV_TIMEOUT_MS`), every request
//! waiting on that server fails with [`Error::LostPeer`] naming it, and so does every later
//! request to it; when the cluster reports a failure (any node dead, or the scheduler gone),
//! every pending and later request fails with it. A request that cannot be encoded (it would
//! break the frame limit) fails alone; a server's refusal is [`Error::Refused`] with its code.
//!
//! **Partitions and failover** (`SYNKV_SERVER_REPLICAS=1`). A request is about one server
//! *partition* (the slicer's server rank, carried in the header) and goes to the live server
//! holding it ([`Topology`]). When a server connection breaks, its requests wait for the
//! scheduler's verdict instead of failing: on `Failover` (the partition's backup took over)
//! they are sent again, flagged `RETRY`, to the new holder — a push the dead server had
//! already replicated is acknowledged there, not applied twice; on `NodeDead`, or without a
//! verdict within twice the heartbeat timeout, they fail as above.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::ps::config::LOOPBACK_STREAMS;
use crate::ps::node::{Node, NodeId, Role};
use crate::ps::proto::{Command, Flags, Message};
use crate::ps::topology::Topology;
use crate::ps::transport::{drain, share, Admission, Drained, FrameReader, Ingress, Landing, Outbox, Transport};
use crate::ps::{auth, Config, Error, Result};

type Reply = oneshot::Sender<Result<(Message, Admission)>>;

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

/// A request waiting for its reply.
struct Waiting {
    /// The partition it is about.
    partition: u32,
    /// The server connection it was sent on (or waits for).
    conn: u32,
    reply: Reply,
    /// With replicas: the message, to send again after a failover.
    resend: Option<Message>,
    /// Where the reply's chunks go, read straight from the socket (`transport/landing.rs`).
    landing: Option<Arc<Landing>>,
}

struct Pending {
    waiting: HashMap<u64, Waiting>,
    /// A failure of the whole cluster: every request fails with it.
    failure: Option<Fail>,
    /// Servers whose connection broke, for good.
    lost: HashMap<u32, Fail>,
    /// With replicas: servers whose connection broke, waiting for the scheduler's verdict.
    broken: HashMap<u32, Fail>,
    /// Which server holds each partition.
    topology: Topology,
}

struct Inner {
    me: NodeId,
    /// Whether partitions have backups (requests wait for a failover instead of failing).
    replicas: bool,
    /// How long a broken connection waits for the scheduler's verdict.
    verdict_within: Duration,
    /// Per server, its node and the outboxes of its connections (`SYNKV_STREAMS`).
    servers: Vec<(Node, Vec<Outbox>)>,
    /// Per server, whether its connections move bulk bytes through shared memory.
    shared: Vec<bool>,
    /// The bytes of received, unconsumed replies, over every server connection.
    ingress: Ingress,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
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
    rx: oneshot::Receiver<Result<(Message, Admission)>>,
    server: u32,
    client: Client,
}

impl Inner {
    /// Queues `msg` on one of server `server`'s connections (they take turns by request id);
    /// `false` if that connection's writer has ended.
    fn send(&self, server: u32, msg: Message) -> bool {
        let Some((_, outboxes)) = self.servers.get(server as usize) else { return false };
        let stream = msg.request_id.checked_rem(outboxes.len() as u64).and_then(|s| usize::try_from(s).ok());
        stream.and_then(|s| outboxes.get(s)).is_some_and(|outbox| outbox.try_send(msg).is_ok())
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails every request waiting on `server` (or on every server) and every later one.
    fn fail(&self, server: Option<u32>, fail: Fail) {
        let failed: Vec<Reply> = {
            let mut p = self.lock();
            match server {
                Some(s) => {
                    p.broken.remove(&s);
                    p.lost.entry(s).or_insert_with(|| fail.clone());
                    let ids: Vec<u64> = p.waiting.iter().filter(|(_, w)| w.conn == s).map(|(id, _)| *id).collect();
                    ids.into_iter().filter_map(|id| p.waiting.remove(&id)).map(|w| w.reply).collect()
                }
                None => {
                    p.failure.get_or_insert_with(|| fail.clone());
                    p.waiting.drain().map(|(_, w)| w.reply).collect()
                }
            }
        };
        for reply in failed {
            let _ = reply.send(Err(fail.to_error()));
        }
    }

    /// Hands a reply (or an error) to the request waiting for `id`.
    fn answer(&self, id: u64, result: Result<(Message, Admission)>) -> bool {
        let waiter = self.lock().waiting.remove(&id);
        match waiter {
            Some(w) => {
                let _ = w.reply.send(result);
                true
            }
            None => false,
        }
    }

    /// The scheduler announced that server `dead` died and its partitions moved to their
    /// backups: every request waiting on it goes again, flagged `RETRY`, to the new holder
    /// of its partition (or keeps waiting while that one's connection is broken too).
    fn failover(&self, dead: u32) {
        let mut resends: Vec<(u32, Message)> = Vec::new();
        {
            let mut p = self.lock();
            if !p.topology.kill(dead) {
                return;
            }
            p.broken.remove(&dead);
            let fail = Fail::Other(format!("server rank {dead} died; its partitions moved to other servers"));
            p.lost.entry(dead).or_insert(fail);
            let topology = p.topology.clone();
            let Pending { waiting, lost, broken, .. } = &mut *p;
            for w in waiting.values_mut() {
                if w.conn != dead && !broken.contains_key(&w.conn) {
                    continue;
                }
                let Some(holder) = topology.holder(w.partition) else { continue };
                w.conn = holder;
                if lost.contains_key(&holder) || broken.contains_key(&holder) {
                    continue;
                }
                if let Some(m) = &w.resend {
                    resends.push((holder, m.clone().with_flags(m.flags.with(Flags::RETRY))));
                }
            }
        }
        tracing::warn!("server rank {dead} died: {} waiting requests go to the servers that took over its partitions", resends.len());
        for (server, msg) in resends {
            let id = msg.request_id;
            let sent = self.send(server, msg);
            if !sent {
                self.answer(id, Err(Error::Shutdown(format!("the connection to server rank {server} is closed"))));
            }
        }
    }
}

impl Client {
    /// Connects and authenticates to every server of `servers` (ordered by rank).
    pub(super) async fn connect<T: Transport>(transport: &T, config: &Config, me: NodeId, servers: Vec<Node>) -> Result<Client> {
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        let mut halves = Vec::with_capacity(servers.len());
        let mut shared = Vec::with_capacity(servers.len());
        for (i, node) in servers.iter().enumerate() {
            // A server of this process shares memory even with SYNKV_SHM=0 (`share.rs`).
            let shm = config.shm || share::in_process(&node.host, node.port);
            let mut all_share = true;
            let mut streams = config.streams.unwrap_or(1).max(1);
            let mut opened = 0;
            while opened < streams {
                let mut conn = auth::dial(transport, node, config, auth::Identity::new(Role::Worker, me), "a connection to").await?;
                all_share &= shm && share::offer(&mut conn, config, me, config.timeout).await?;
                halves.push((i, conn.into_split()));
                opened += 1;
                if opened == 1 && config.streams.is_none() && !all_share && on_this_host(&node.host).await {
                    streams = LOOPBACK_STREAMS;
                }
            }
            if all_share {
                tracing::debug!("bulk bytes to and from {node} go through shared memory");
            } else if streams > 1 {
                tracing::debug!("{streams} connections to {node}");
            }
            shared.push(all_share);
        }
        let mut links: Vec<(Node, Vec<Outbox>)> = servers.into_iter().map(|node| (node, Vec::new())).collect();
        let mut tasks = Vec::with_capacity(halves.len());
        for (i, (reader, writer)) in halves {
            let (outbox, rx) = Outbox::unbounded();
            links[i].1.push(outbox);
            tasks.push((i, reader, writer, rx));
        }
        let num_servers = u32::try_from(links.len()).unwrap_or(u32::MAX);
        let pending = Pending {
            waiting: HashMap::new(),
            failure: None,
            lost: HashMap::new(),
            broken: HashMap::new(),
            topology: Topology::new(num_servers),
        };
        let inner = Arc::new(Inner {
            me,
            replicas: config.replicas > 0,
            verdict_within: config.heartbeat_timeout * 2 + Duration::from_secs(1),
            servers: links,
            shared,
            ingress: Ingress::new(config.window_bytes()),
            pending: Mutex::new(pending),
            next_id: AtomicU64::new(1),
            stop: stop.clone(),
            tracker: tracker.clone(),
        });
        for (i, reader, mut writer, rx) in tasks {
            let server = u32::try_from(i).unwrap_or(u32::MAX);
            // Ends this server's writer (and frees its shared memory) once its reader ended.
            let link = inner.stop.child_token();
            tracker.spawn(read_loop(reader, Arc::clone(&inner), server, link.clone()));
            writer.set_stall_timeout(Some(config.timeout));
            let inner = Arc::clone(&inner);
            tracker.spawn(async move {
                let unsendable = |m: &Message, e: &crate::ps::proto::EncodeError| {
                    // Our own message breaks the limits: fail that request only.
                    inner.answer(m.request_id, Err(Error::Encode(*e)));
                    None
                };
                if let Drained::Failed(e) = drain(writer, rx, link, unsendable).await {
                    lose(&inner, server, format!("write failed: {e}"));
                }
            });
        }
        Ok(Client { inner })
    }

    /// Fails every pending and later request with `e` (the cluster failed).
    pub(super) fn fail_all(&self, e: &Error) {
        self.inner.fail(None, Fail::of(e));
    }

    /// Server `dead` died and its partitions moved to their backups (see the module docs).
    pub(super) fn failover(&self, dead: u32) {
        self.inner.failover(dead);
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

    /// Whether the connection to server rank `server` moves bulk bytes through shared memory.
    pub fn shares_memory(&self, server: u32) -> bool {
        usize::try_from(server).ok().and_then(|i| self.inner.shared.get(i)).copied().unwrap_or(false)
    }

    /// The server of rank `server`.
    pub fn server(&self, server: u32) -> Option<&Node> {
        self.inner.servers.get(usize::try_from(server).ok()?).map(|(n, _)| n)
    }

    /// Sends `msg` about partition `server` (the slicer's server rank) as a request to the
    /// server holding that partition, and returns its waiter. Fails at once if the cluster
    /// or that server is already lost.
    pub fn start(&self, server: u32, msg: Message) -> Result<Waiter> {
        self.start_landing(server, msg, None)
    }

    /// [`start`](Client::start), with the destinations of the reply's chunks: the reader
    /// writes them there as they arrive when the reply is the expected one (its message is
    /// then flagged [`Flags::LANDED`]); otherwise the receiver finds the targets in `landing`.
    pub fn start_landing(&self, server: u32, mut msg: Message, landing: Option<Arc<Landing>>) -> Result<Waiter> {
        let inner = &self.inner;
        let partition = u16::try_from(server)
            .ok()
            .filter(|_| (server as usize) < inner.servers.len())
            .ok_or_else(|| Error::InvalidArgument(format!("no server of rank {server} ({} servers)", inner.servers.len())))?;
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        msg.request_id = id;
        msg.sender = inner.me;
        msg.partition = Some(partition);
        msg.flags = msg.flags.with(Flags::REQUEST);
        let (tx, rx) = oneshot::channel();
        let conn = {
            let mut p = inner.lock();
            let conn = p.topology.holder(server).unwrap_or(server);
            if let Some(f) = p.failure.as_ref().or_else(|| p.lost.get(&conn)) {
                return Err(f.to_error());
            }
            let resend = inner.replicas.then(|| msg.clone());
            let parked = p.broken.contains_key(&conn);
            p.waiting.insert(id, Waiting { partition: server, conn, reply: tx, resend, landing });
            if parked {
                // Sent after the scheduler's verdict on the broken connection.
                return Ok(Waiter { rx, server, client: self.clone() });
            }
            conn
        };
        let sent = inner.send(conn, msg);
        if !sent && inner.replicas {
            // The connection's writer ended before its reader reported the break: the request
            // waits for the scheduler's verdict like one parked on a broken connection (sent
            // again to the new holder of its partition, or failed).
            return Ok(Waiter { rx, server, client: self.clone() });
        }
        if !sent {
            inner.lock().waiting.remove(&id);
            return Err(Error::Shutdown("the connection to the server is closed".into()));
        }
        Ok(Waiter { rx, server, client: self.clone() })
    }

    /// Sends one request per `(server, message)` and waits for every reply. Replies come
    /// back in the order of `msgs`.
    pub async fn request_all(&self, msgs: Vec<(u32, Message)>) -> Result<Vec<Message>> {
        let mut waiters = Vec::with_capacity(msgs.len());
        for (server, msg) in msgs {
            waiters.push(self.start(server, msg)?);
        }
        let mut out: Vec<Option<Message>> = vec![None; waiters.len()];
        let mut first_error = None;
        wait_each(waiters, |i, reply| match reply {
            Ok((msg, _)) => out[i] = Some(msg),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        })
        .await;
        match first_error {
            Some(e) => Err(e),
            None => Ok(out.into_iter().flatten().collect()),
        }
    }
}

/// Waits for every waiter, handing each reply to `on_reply(index, reply)` as soon as it
/// arrives — in arrival order, not request order — with its share of the replies' ingress
/// budget, which returns when dropped. Consuming replies as they come is what keeps the
/// budget from deadlocking: a reply that arrived is never held while a later one is awaited.
pub async fn wait_each(waiters: Vec<Waiter>, mut on_reply: impl FnMut(usize, Result<(Message, Admission)>)) {
    let mut set = tokio::task::JoinSet::new();
    for (i, w) in waiters.into_iter().enumerate() {
        set.spawn(async move { (i, w.wait_admitted().await) });
    }
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((i, reply)) => on_reply(i, reply),
            Err(e) => tracing::error!("a reply waiter stopped: {e}"),
        }
    }
}

impl Waiter {
    /// Waits for the reply, as long as the server and the cluster are alive. An `Error` reply
    /// becomes [`Error::Refused`].
    pub async fn wait(self) -> Result<Message> {
        self.wait_admitted().await.map(|(msg, _)| msg)
    }

    /// [`wait`](Waiter::wait), with the reply's share of the ingress budget: keep it while
    /// the reply's bytes are in use (they count against the budget until it is dropped).
    pub async fn wait_admitted(self) -> Result<(Message, Admission)> {
        let Waiter { rx, server, client } = self;
        match rx.await {
            Ok(Ok((msg, _))) if msg.command == Command::Error => {
                let key = msg.meta.keys.first().map(|k| (*k, msg.meta.offsets.first().copied().unwrap_or(0)));
                match client.server(server).cloned() {
                    Some(node) => Err(Error::Refused { node, code: msg.error_code(), message: msg.meta.text, key }),
                    None => Err(Error::Shutdown(msg.meta.text)),
                }
            }
            Ok(result) => result,
            Err(_) => Err(Error::Shutdown("the worker is shutting down".into())),
        }
    }
}

/// Whether `host` (a server's advertised address) names this machine: a loopback address, or
/// one a socket here can bind to (an address of one of this host's interfaces; wrong only
/// where `net.ipv4.ip_nonlocal_bind` is set, which costs a second connection, never a byte).
/// A name that does not resolve is another host's.
async fn on_this_host(host: &str) -> bool {
    let Ok(addrs) = tokio::net::lookup_host((host, 0)).await else { return false };
    addrs.map(|a| a.ip()).any(|ip| ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok())
}

async fn read_loop(mut reader: FrameReader, inner: Arc<Inner>, server: u32, link: CancellationToken) {
    let _writer = link.drop_guard();
    // Only a request sent on this connection lands its reply from it.
    let landings = |id: u64| inner.lock().waiting.get(&id).filter(|w| w.conn == server).and_then(|w| w.landing.clone());
    let reason = loop {
        let read = tokio::select! {
            r = reader.read_landing(&inner.ingress, &landings) => r,
            () = inner.stop.cancelled() => return,
        };
        match read {
            Ok(Some((msg, admission))) if matches!(msg.command, Command::Reply | Command::Error) => {
                let (id, is_error) = (msg.request_id, msg.command == Command::Error);
                let text = is_error.then(|| msg.meta.text.clone());
                if !inner.answer(id, Ok((msg, admission))) {
                    match text {
                        Some(text) => tracing::warn!("{} reported: {text}", reader.peer()),
                        None => tracing::debug!("late reply {id} from {} dropped", reader.peer()),
                    }
                }
            }
            Ok(Some((msg, _))) if msg.command == Command::Notice => tracing::warn!("{} reports: {}", reader.peer(), msg.meta.text),
            Ok(Some((msg, _))) if msg.command == Command::NodeDead => match msg.single_node() {
                // The server stops because a node died: fail everything with the real cause.
                Ok(node) => inner.fail(None, Fail::Lost { node: node.clone(), reason: msg.meta.text.clone() }),
                Err(e) => tracing::warn!("malformed NodeDead from {}: {e}", reader.peer()),
            },
            Ok(Some((msg, _))) => tracing::warn!("ignoring unexpected {:?} from {}", msg.command, reader.peer()),
            Ok(None) => break "connection closed".to_owned(),
            Err(e) => break format!("connection failed: {e}"),
        }
    };
    if inner.stop.is_cancelled() {
        return;
    }
    lose(&inner, server, reason);
}

/// The connection to `server` broke. Without replicas its requests fail now; with them they
/// wait for the scheduler's verdict (a failover sends them on), bounded by `verdict_within`.
fn lose(inner: &Arc<Inner>, server: u32, reason: String) {
    let Some(node) = inner.servers.get(usize::try_from(server).unwrap_or(usize::MAX)).map(|(n, _)| n.clone()) else { return };
    let fail = Fail::Lost { node: node.clone(), reason: reason.clone() };
    crate::ps::trace::dump(Role::Worker, &crate::ps::trace::lost_cause(&node), &format!("the connection to {node} broke: {reason}"));
    if !inner.replicas {
        tracing::error!("lost {node}: {reason}");
        inner.fail(Some(server), fail);
        return;
    }
    {
        let mut p = inner.lock();
        if !p.topology.alive(server) || p.lost.contains_key(&server) {
            return; // already failed over (or lost)
        }
        p.broken.insert(server, fail.clone());
    }
    tracing::warn!("connection to {node} broke ({reason}); waiting for the scheduler's verdict before failing its requests");
    let (inner, within) = (Arc::clone(inner), inner.verdict_within);
    let tracker = inner.tracker.clone();
    tracker.spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(within) => {}
            () = inner.stop.cancelled() => return,
        }
        if inner.lock().broken.contains_key(&server) {
            tracing::error!("lost {node}: {reason} (no failover within {within:?})");
            inner.fail(Some(server), fail);
        }
    });
}

//! [`TcpTransport`]: tokio TCP with TCP_NODELAY, the kernel's buffer autotuning unless a job
//! sizes the socket buffers (`SYNKV_SOCKET_BUFFER`) and, when asked for
//! (`SYNKV_TCP_CONGESTION`), a congestion control of the job's choice.
//!
//! Fixed buffers and the congestion control are set on the socket before `listen`/`connect` so
//! the kernel can scale the TCP window for them; accepted sockets inherit the listener's. The
//! kernel caps fixed buffers at `net.core.wmem_max`/`rmem_max` (that is not an error) and stops
//! autotuning those sockets: 212992 bytes on a stock Linux, too little for a fast link with any
//! delay. Autotuning grows each buffer up to `net.ipv4.tcp_rmem`/`tcp_wmem`'s maximum as the
//! connection needs; measured against fixed 4 MiB buffers (BENCHMARKS.md, 2026-12-07
//! afternoon) it is 3–10 % faster over loopback and ties on 1 Gbit/s links.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{lookup_host, TcpListener, TcpSocket, TcpStream};

use super::{Connection, Listener, Transport};
use crate::ps::proto::Limits;
use crate::ps::Result;

/// TCP transport (the default).
#[derive(Clone, Debug)]
pub struct TcpTransport {
    limits: Limits,
    /// SO_SNDBUF / SO_RCVBUF of new sockets; `None`: the kernel's autotuning.
    socket_buffer: Option<u32>,
    congestion: Option<Arc<str>>,
}

impl TcpTransport {
    /// A transport whose connections apply `limits`, with autotuned socket buffers.
    pub fn new(limits: Limits) -> TcpTransport {
        TcpTransport { limits, socket_buffer: None, congestion: None }
    }

    /// The transport a node of `config` uses: its frame limits, its `SYNKV_SOCKET_BUFFER` and
    /// its `SYNKV_TCP_CONGESTION`.
    pub fn for_config(config: &crate::ps::Config) -> TcpTransport {
        let t = TcpTransport::new(config.limits).with_congestion(config.tcp_congestion.as_deref());
        match config.socket_buffer {
            Some(bytes) => t.with_socket_buffer(bytes),
            None => t,
        }
    }

    /// Sets the TCP congestion control of new sockets (`None`: the host's default). The name
    /// is checked when the configuration is read ([`check_congestion`]); a socket that still
    /// refuses it fails its `bind` or `connect`.
    #[must_use]
    pub fn with_congestion(mut self, name: Option<&str>) -> TcpTransport {
        self.congestion = name.map(Arc::from);
        self
    }

    /// Sets SO_SNDBUF/SO_RCVBUF of new sockets to `bytes` (no autotuning for them).
    #[must_use]
    pub fn with_socket_buffer(mut self, bytes: u32) -> TcpTransport {
        self.socket_buffer = Some(bytes);
        self
    }

    fn socket(&self, addr: &SocketAddr) -> Result<TcpSocket> {
        let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.set_nodelay(true)?;
        if let Some(bytes) = self.socket_buffer {
            if let Err(e) = socket.set_send_buffer_size(bytes).and_then(|()| socket.set_recv_buffer_size(bytes)) {
                tracing::debug!("could not size socket buffers: {e}");
            }
        }
        if let Some(name) = &self.congestion {
            set_congestion(&socket, name)?;
        }
        Ok(socket)
    }

    fn wrap(&self, stream: TcpStream, peer: String) -> Result<Connection> {
        stream.set_nodelay(true)?;
        Ok(Connection::new(stream, peer, self.limits))
    }
}

impl Default for TcpTransport {
    fn default() -> TcpTransport {
        TcpTransport::new(Limits::default())
    }
}

/// Sets `name` as the congestion control of `socket` (TCP_CONGESTION).
#[cfg(target_os = "linux")]
fn set_congestion(socket: &impl std::os::fd::AsFd, name: &str) -> std::io::Result<()> {
    socket2::SockRef::from(socket).set_tcp_congestion(name.as_bytes())
}

#[cfg(not(target_os = "linux"))]
fn set_congestion<S>(_socket: &S, _name: &str) -> std::io::Result<()> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "TCP_CONGESTION is set only on Linux"))
}

/// Warns once per process when a connection to another host runs BBR, the host's default
/// congestion control: synkv's many-to-many flows share links unfairly under BBR v1.
fn hint_at_bbr(stream: &TcpStream, peer: &SocketAddr) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if ONCE.is_completed() {
        return;
    }
    #[cfg(target_os = "linux")]
    let algorithm = socket2::SockRef::from(stream).tcp_congestion().unwrap_or_default();
    #[cfg(not(target_os = "linux"))]
    let algorithm: Vec<u8> = Vec::new();
    if let Some(hint) = bbr_hint(&algorithm, peer) {
        ONCE.call_once(|| tracing::warn!("{hint}"));
    }
}

/// The hint [`hint_at_bbr`] gives for a connection to `peer` running `algorithm` (the
/// kernel's NUL-padded name), if any: none on loopback, where nothing crosses a link.
fn bbr_hint(algorithm: &[u8], peer: &SocketAddr) -> Option<String> {
    let name = algorithm.split(|b| *b == 0).next().unwrap_or_default();
    (name == b"bbr" && !peer.ip().is_loopback()).then(|| {
        format!(
            "the connection to {peer} uses TCP congestion control bbr, this host's default: a worker's flows to \
             several servers share its link unfairly under BBR v1 (4 workers + 4 servers at 1 Gbit/s measured 1.06-1.15x \
             gloo's throughput, 1.32-1.37x with cubic); SYNKV_TCP_CONGESTION=cubic on every process changes synkv's \
             sockets only (docs/dist.md, TCP congestion control)"
        )
    })
}

/// Whether this process may use the TCP congestion control `name`: tried on a fresh socket.
/// The error says why not and what the host offers.
pub fn check_congestion(name: &str) -> std::result::Result<(), String> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .map_err(|e| format!("no socket to try {name:?} on: {e}"))?;
    set_congestion(&socket, name).map_err(|e| {
        let read = |file: &str| {
            std::fs::read_to_string(format!("/proc/sys/net/ipv4/{file}")).map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned())
        };
        format!(
            "the kernel refuses {name:?} ({e}); this host has [{}], and a process without CAP_NET_ADMIN may use [{}]",
            read("tcp_available_congestion_control"),
            read("tcp_allowed_congestion_control")
        )
    })
}

async fn resolve(addr: &str) -> Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = lookup_host(addr).await?.collect();
    if addrs.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, format!("{addr} resolves to no address")).into());
    }
    Ok(addrs)
}

impl Transport for TcpTransport {
    type Listener = TcpFrameListener;

    async fn bind(&self, addr: &str) -> Result<TcpFrameListener> {
        let mut last = None;
        for a in resolve(addr).await? {
            let socket = self.socket(&a)?;
            socket.set_reuseaddr(true)?;
            match socket.bind(a).and_then(|()| socket.listen(1024)) {
                Ok(inner) => return Ok(TcpFrameListener { inner, transport: self.clone() }),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::ErrorKind::AddrNotAvailable.into()).into())
    }

    async fn connect(&self, addr: &str) -> Result<Connection> {
        let mut last = None;
        for a in resolve(addr).await? {
            match self.socket(&a)?.connect(a).await {
                Ok(stream) => {
                    if self.congestion.is_none() {
                        hint_at_bbr(&stream, &a);
                    }
                    return self.wrap(stream, addr.to_owned());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::ErrorKind::AddrNotAvailable.into()).into())
    }
}

/// A bound TCP listener.
#[derive(Debug)]
pub struct TcpFrameListener {
    inner: TcpListener,
    transport: TcpTransport,
}

impl TcpFrameListener {
    /// The bound socket address.
    pub fn socket_addr(&self) -> Result<SocketAddr> {
        Ok(self.inner.local_addr()?)
    }
}

impl Listener for TcpFrameListener {
    fn local_addr(&self) -> Result<String> {
        Ok(self.inner.local_addr()?.to_string())
    }

    async fn accept(&mut self) -> Result<(Connection, String)> {
        let (stream, peer) = self.inner.accept().await?;
        let peer = peer.to_string();
        Ok((self.transport.wrap(stream, peer.clone())?, peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::proto::{Chunk, Command, DTypeCode, Message};
    use bytes::Bytes;
    use std::time::Duration;

    #[tokio::test]
    async fn loopback_round_trip_of_a_bulk_tensor() {
        let t = TcpTransport::default();
        let mut listener = t.bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut msg = Message::new(Command::Push);
        msg.meta.keys = vec![1];
        msg.meta.lens = vec![8 << 20];
        msg.chunks.push(Chunk { dtype: DTypeCode::F32, data: Bytes::from(vec![1u8; 8 << 20]) });
        let expect = msg.clone();
        let client = tokio::spawn(async move {
            let mut c = t.connect(&addr).await.unwrap();
            c.write_message(&msg).await.unwrap();
        });
        let (mut conn, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept()).await.unwrap().unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), conn.read_message()).await.unwrap().unwrap();
        assert_eq!(got, Some(expect));
        client.await.unwrap();
    }

    /// Sockets keep the kernel's autotuning unless a size is asked for; then both buffers are
    /// at least that size (Linux doubles the value for its bookkeeping, capped by
    /// `net.core.rmem_max`, so the test asks for a size below every cap).
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn socket_buffers_are_autotuned_unless_sized() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let autotuned = TcpTransport::default().socket(&any).unwrap();
        let fresh = TcpSocket::new_v4().unwrap();
        assert_eq!(autotuned.recv_buffer_size().unwrap(), fresh.recv_buffer_size().unwrap(), "the kernel's default");
        assert_eq!(autotuned.send_buffer_size().unwrap(), fresh.send_buffer_size().unwrap(), "the kernel's default");
        let sized = TcpTransport::default().with_socket_buffer(96 << 10).socket(&any).unwrap();
        assert!(sized.recv_buffer_size().unwrap() >= 96 << 10 && sized.send_buffer_size().unwrap() >= 96 << 10);
        assert_ne!(sized.recv_buffer_size().unwrap(), fresh.recv_buffer_size().unwrap(), "a fixed size, not the default");
    }

    #[tokio::test]
    async fn connect_to_nobody_fails_fast() {
        let t = TcpTransport::default();
        let addr = t.bind("127.0.0.1:0").await.unwrap().local_addr().unwrap(); // dropped: port closed
        assert!(tokio::time::timeout(Duration::from_secs(10), t.connect(&addr)).await.unwrap().is_err());
    }

    /// The congestion control asked for is on both ends of a connection: set on the connecting
    /// socket, and inherited by an accepted one from its listener. `reno` is built into every
    /// Linux kernel and is nobody's default, so the test sees the setting, not the default.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn both_ends_of_a_connection_use_the_congestion_control_asked_for() {
        let congestion = |s: &TcpStream| {
            let mut name = socket2::SockRef::from(s).tcp_congestion().unwrap();
            name.retain(|b| *b != 0); // the kernel pads the name with NULs
            name
        };
        let t = TcpTransport::default().with_congestion(Some("reno"));
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let listener = t.socket(&any).unwrap();
        listener.bind(any).unwrap();
        let listener = listener.listen(16).unwrap();
        let addr = listener.local_addr().unwrap();
        let (connected, accepted) = tokio::join!(t.socket(&addr).unwrap().connect(addr), listener.accept());
        assert_eq!(congestion(&connected.unwrap()), b"reno");
        assert_eq!(congestion(&accepted.unwrap().0), b"reno");

        let plain = TcpTransport::default().socket(&addr).unwrap().connect(addr);
        let (plain, accepted) = tokio::join!(plain, listener.accept());
        let default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap();
        assert_eq!(congestion(&plain.unwrap()), default.trim().as_bytes(), "no setting: the host's default");
        drop(accepted);
    }

    #[test]
    fn a_congestion_control_the_kernel_lacks_is_refused_with_what_it_offers() {
        assert_eq!(check_congestion("reno"), Ok(()));
        let e = check_congestion("no_such_cc").unwrap_err();
        assert!(e.contains("refuses \"no_such_cc\"") && e.contains("reno"), "{e}");
    }

    #[test]
    fn bbr_on_a_connection_to_another_host_gets_a_hint_and_nothing_else_does() {
        let remote: SocketAddr = "10.0.0.2:9000".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        let hint = bbr_hint(b"bbr\0\0\0\0\0\0\0\0\0\0\0\0\0", &remote).unwrap();
        assert!(hint.contains("10.0.0.2:9000") && hint.contains("SYNKV_TCP_CONGESTION=cubic"), "{hint}");
        assert_eq!(bbr_hint(b"bbr", &local), None, "loopback crosses no link");
        assert_eq!(bbr_hint(b"cubic\0\0", &remote), None);
        assert_eq!(bbr_hint(b"bbr2", &remote), None);
        assert_eq!(bbr_hint(b"", &remote), None);
    }
}

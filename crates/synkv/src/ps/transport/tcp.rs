//! [`TcpTransport`]: tokio TCP with TCP_NODELAY and socket buffers sized for bulk tensors.
//!
//! Buffers are set on the socket before `listen`/`connect` so the kernel can scale the TCP
//! window for them; accepted sockets inherit the listener's. The kernel may cap the size
//! (`net.core.wmem_max`/`rmem_max`); that is not an error.

use std::net::SocketAddr;

use tokio::net::{lookup_host, TcpListener, TcpSocket, TcpStream};

use super::{Connection, Listener, Transport};
use crate::ps::proto::Limits;
use crate::ps::Result;

/// Default SO_SNDBUF / SO_RCVBUF in bytes.
pub const DEFAULT_SOCKET_BUFFER: u32 = 4 << 20;

/// TCP transport (the default).
#[derive(Clone, Debug)]
pub struct TcpTransport {
    limits: Limits,
    socket_buffer: u32,
}

impl TcpTransport {
    /// A transport whose connections apply `limits`, with 4 MiB socket buffers.
    pub fn new(limits: Limits) -> TcpTransport {
        TcpTransport { limits, socket_buffer: DEFAULT_SOCKET_BUFFER }
    }

    /// Sets SO_SNDBUF/SO_RCVBUF for new sockets.
    #[must_use]
    pub fn with_socket_buffer(mut self, bytes: u32) -> TcpTransport {
        self.socket_buffer = bytes;
        self
    }

    fn socket(&self, addr: &SocketAddr) -> Result<TcpSocket> {
        let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.set_nodelay(true)?;
        if let Err(e) = socket.set_send_buffer_size(self.socket_buffer).and_then(|()| socket.set_recv_buffer_size(self.socket_buffer)) {
            tracing::debug!("could not size socket buffers: {e}");
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
                Ok(stream) => return self.wrap(stream, addr.to_owned()),
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

    #[tokio::test]
    async fn connect_to_nobody_fails_fast() {
        let t = TcpTransport::default();
        let addr = t.bind("127.0.0.1:0").await.unwrap().local_addr().unwrap(); // dropped: port closed
        assert!(tokio::time::timeout(Duration::from_secs(10), t.connect(&addr)).await.unwrap().is_err());
    }
}

//! [`MemTransport`]: connections between tasks of one process over in-memory pipes.
//!
//! Each transport value is its own namespace of addresses (clones share it). Ports are
//! handed out from 1 upward for `host:0`. Used by tests that run on paused tokio time, where
//! real sockets would race the auto-advancing clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::DuplexStream;
use tokio::sync::mpsc;

use super::{Connection, Listener, Transport};
use crate::ps::proto::Limits;
use crate::ps::Result;

/// Capacity of each in-memory pipe, per direction.
const PIPE_BYTES: usize = 256 * 1024;

type Incoming = (DuplexStream, String);

#[derive(Debug, Default)]
struct Registry {
    next_port: u16,
    next_client: u64,
    listeners: HashMap<String, mpsc::Sender<Incoming>>,
}

/// An in-process transport.
#[derive(Clone, Debug, Default)]
pub struct MemTransport {
    registry: Arc<Mutex<Registry>>,
    limits: Limits,
}

impl MemTransport {
    /// An empty namespace whose connections apply `limits`.
    pub fn new(limits: Limits) -> MemTransport {
        MemTransport { registry: Arc::default(), limits }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn refused(addr: &str) -> crate::ps::Error {
    std::io::Error::new(std::io::ErrorKind::ConnectionRefused, format!("nothing listens on {addr}")).into()
}

impl Transport for MemTransport {
    type Listener = MemListener;

    async fn bind(&self, addr: &str) -> Result<MemListener> {
        let (host, port) = addr.rsplit_once(':').ok_or_else(|| refused(addr))?;
        let mut reg = self.lock();
        let addr = if port == "0" {
            reg.next_port = reg.next_port.checked_add(1).ok_or_else(|| refused(addr))?;
            format!("{host}:{}", reg.next_port)
        } else {
            addr.to_owned()
        };
        if reg.listeners.get(&addr).is_some_and(|tx| !tx.is_closed()) {
            return Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("{addr} is in use")).into());
        }
        let (tx, rx) = mpsc::channel(128);
        reg.listeners.insert(addr.clone(), tx);
        Ok(MemListener { rx, addr, transport: self.clone() })
    }

    async fn connect(&self, addr: &str) -> Result<Connection> {
        let (tx, client) = {
            let mut reg = self.lock();
            reg.next_client += 1;
            let client = format!("mem-client-{}", reg.next_client);
            (reg.listeners.get(addr).cloned().ok_or_else(|| refused(addr))?, client)
        };
        let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
        tx.send((theirs, client)).await.map_err(|_| refused(addr))?;
        Ok(Connection::new(ours, addr.to_owned(), self.limits))
    }
}

/// A bound in-memory listener; unbinds when dropped.
#[derive(Debug)]
pub struct MemListener {
    rx: mpsc::Receiver<Incoming>,
    addr: String,
    transport: MemTransport,
}

impl Listener for MemListener {
    fn local_addr(&self) -> Result<String> {
        Ok(self.addr.clone())
    }

    async fn accept(&mut self) -> Result<(Connection, String)> {
        let (stream, peer) = self.rx.recv().await.ok_or_else(|| refused(&self.addr))?;
        Ok((Connection::new(stream, peer.clone(), self.transport.limits), peer))
    }
}

impl Drop for MemListener {
    fn drop(&mut self) {
        self.transport.lock().listeners.remove(&self.addr);
    }
}

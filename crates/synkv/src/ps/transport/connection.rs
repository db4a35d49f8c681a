//! [`Connection`]: whole [`Message`]s over one byte stream, split into a [`FrameReader`] and a
//! [`FrameWriter`] so one task can read while another writes.
//!
//! Reading follows mini-redis: bytes accumulate in a buffer; [`check`] says whether a whole
//! frame is there, and the buffer grows to the frame's announced size only after the header
//! passed the [`Limits`]. A clean EOF between frames is `Ok(None)`; EOF inside a frame is
//! [`Error::EofMidFrame`]. Writing hands the encoded head and every chunk's own `Bytes` to
//! vectored I/O, so tensor bytes are never copied into an intermediate buffer.

use std::fmt;
use std::io::IoSlice;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};

use crate::ps::proto::{check, parse, Header, Limits, Message, HEADER_LEN};
use crate::ps::{Error, Result};

/// Any byte stream a connection can run over.
pub(crate) trait IoStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> IoStream for T {}

type BoxStream = Box<dyn IoStream>;

/// Smallest spare capacity kept for reads, so small frames arrive in few reads.
const MIN_READ: usize = 8 * 1024;
/// Frames at least this large leave their allocation for reuse by a later large frame, once
/// the caller dropped them: a fresh multi-MiB allocation costs a page fault per page.
const RECYCLE_MIN: usize = 1 << 20;
/// Most slices handed to one vectored write (below every platform's IOV_MAX).
const MAX_IOV: usize = 64;
/// Source of chunk padding.
static ZEROS: [u8; 8] = [0; 8];

/// One framed stream to a peer.
pub struct Connection {
    reader: FrameReader,
    writer: FrameWriter,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection").field("peer", &self.reader.peer).finish_non_exhaustive()
    }
}

impl Connection {
    /// Wraps `stream`; `peer` names the other end in errors and logs.
    pub fn new<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(stream: S, peer: impl Into<String>, limits: Limits) -> Connection {
        let boxed: BoxStream = Box::new(stream);
        let (r, w) = tokio::io::split(boxed);
        let peer: Arc<str> = Arc::from(peer.into());
        Connection {
            reader: FrameReader { io: r, buffer: BytesMut::with_capacity(MIN_READ), limits, peer: peer.clone(), recycle: None },
            writer: FrameWriter { io: w, limits, peer },
        }
    }

    /// The peer's name (address, or what the owner set with [`set_peer`](Connection::set_peer)).
    pub fn peer(&self) -> &str {
        &self.reader.peer
    }

    /// Renames the peer (e.g. once it registered as a node).
    pub fn set_peer(&mut self, peer: impl Into<String>) {
        let peer: Arc<str> = Arc::from(peer.into());
        self.reader.peer = peer.clone();
        self.writer.peer = peer;
    }

    /// The limits applied to frames in both directions.
    pub fn limits(&self) -> Limits {
        self.reader.limits
    }

    /// Replaces the limits (e.g. tighter ones during the handshake).
    pub fn set_limits(&mut self, limits: Limits) {
        self.reader.limits = limits;
        self.writer.limits = limits;
    }

    /// Reads the next message; `Ok(None)` on a clean EOF between frames. Cancel-safe.
    pub async fn read_message(&mut self) -> Result<Option<Message>> {
        self.reader.read_message().await
    }

    /// Writes one message (vectored; chunks are not copied). Not cancel-safe: a cancelled
    /// write may leave half a frame, so the connection must then be dropped.
    pub async fn write_message(&mut self, msg: &Message) -> Result<()> {
        self.writer.write_message(msg).await
    }

    /// Splits into independently usable halves.
    pub fn into_split(self) -> (FrameReader, FrameWriter) {
        (self.reader, self.writer)
    }
}

/// The reading half of a [`Connection`].
pub struct FrameReader {
    io: ReadHalf<BoxStream>,
    buffer: BytesMut,
    limits: Limits,
    peer: Arc<str>,
    /// The last large frame (a cheap handle); its allocation is reused when we hold the only
    /// handle left.
    recycle: Option<Bytes>,
}

impl fmt::Debug for FrameReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameReader").field("peer", &self.peer).field("buffered", &self.buffer.len()).finish_non_exhaustive()
    }
}

impl FrameReader {
    /// The peer's name.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Reads the next message; `Ok(None)` on a clean EOF between frames. Cancel-safe: all
    /// state lives in the buffer, and the only await is one read.
    pub async fn read_message(&mut self) -> Result<Option<Message>> {
        loop {
            if let Some(msg) = self.parse_buffered()? {
                return Ok(Some(msg));
            }
            if self.io.read_buf(&mut self.buffer).await? == 0 {
                if self.buffer.is_empty() {
                    return Ok(None);
                }
                return Err(Error::EofMidFrame { peer: self.peer.to_string(), buffered: self.buffer.len() });
            }
        }
    }

    /// Takes one frame out of the buffer if a whole one is there; otherwise makes room for
    /// the rest of it (bounded by the validated header, or a small constant before that).
    fn parse_buffered(&mut self) -> Result<Option<Message>> {
        let protocol = |e| Error::protocol(self.peer.to_string(), e);
        if let Some(len) = check(&self.buffer, &self.limits).map_err(protocol)? {
            let frame = self.buffer.split_to(len).freeze();
            if len >= RECYCLE_MIN {
                // Let go of the allocation's tail (copying the few bytes of the next frame read
                // so far), so the whole allocation can be reused once the caller drops the frame.
                self.buffer = BytesMut::from(&self.buffer[..]);
                self.recycle = Some(frame.clone());
            }
            return parse(frame, &self.limits).map(Some).map_err(protocol);
        }
        let want = if self.buffer.len() >= HEADER_LEN {
            Header::decode(&self.buffer, &self.limits).and_then(|h| h.frame_len()).map_err(protocol)?
        } else {
            HEADER_LEN
        };
        let need = want.saturating_sub(self.buffer.len()).max(MIN_READ);
        if self.buffer.capacity() - self.buffer.len() < need {
            self.reuse_recycled(self.buffer.len() + need);
        }
        self.buffer.reserve(need);
        Ok(None)
    }

    /// Moves the buffered bytes into the last large frame's allocation if nobody else holds
    /// that frame any more and it can take `total` bytes.
    fn reuse_recycled(&mut self, total: usize) {
        if !self.recycle.as_ref().is_some_and(Bytes::is_unique) {
            return;
        }
        let Some(old) = self.recycle.take() else { return };
        if let Ok(mut spare) = old.try_into_mut() {
            spare.clear();
            if spare.capacity() >= total {
                spare.extend_from_slice(&self.buffer);
                self.buffer = spare;
            }
        }
    }
}

/// The writing half of a [`Connection`].
pub struct FrameWriter {
    io: WriteHalf<BoxStream>,
    limits: Limits,
    peer: Arc<str>,
}

impl fmt::Debug for FrameWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameWriter").field("peer", &self.peer).finish_non_exhaustive()
    }
}

impl FrameWriter {
    /// The peer's name.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Writes one message: `[head, chunk0, pad0, chunk1, pad1, …]` through vectored writes.
    /// Not cancel-safe (see [`Connection::write_message`]).
    pub async fn write_message(&mut self, msg: &Message) -> Result<()> {
        let mut segments: Vec<Bytes> = Vec::with_capacity(1 + 2 * msg.chunks.len());
        segments.push(msg.encode_head(&self.limits)?.freeze());
        for chunk in &msg.chunks {
            if !chunk.data.is_empty() {
                segments.push(chunk.data.clone());
            }
            let pad = Message::chunk_padding(chunk.data.len());
            if pad > 0 {
                segments.push(Bytes::from_static(&ZEROS[..pad]));
            }
        }
        write_all_vectored(&mut self.io, segments).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// Flushes and closes the write direction (the peer reads a clean EOF).
    pub async fn shutdown(&mut self) -> Result<()> {
        self.io.shutdown().await?;
        Ok(())
    }
}

/// Writes every segment, in order, with as few vectored writes as the stream allows.
async fn write_all_vectored<W: AsyncWrite + Unpin>(w: &mut W, mut segments: Vec<Bytes>) -> std::io::Result<()> {
    let mut first = 0;
    while first < segments.len() {
        let written = {
            let slices: Vec<IoSlice<'_>> = segments[first..].iter().take(MAX_IOV).map(|b| IoSlice::new(b)).collect();
            w.write_vectored(&slices).await?
        };
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let mut left = written;
        while left > 0 && first < segments.len() {
            let seg = &mut segments[first];
            if left >= seg.len() {
                left -= seg.len();
                first += 1;
            } else {
                seg.advance(left);
                left = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::proto::{Chunk, Command, DTypeCode};

    fn big_message(n: usize) -> Message {
        let mut m = Message::new(Command::Push);
        m.meta.keys = vec![1, 2];
        m.meta.lens = vec![(n * 4) as u64, 3];
        m.chunks.push(Chunk { dtype: DTypeCode::F32, data: Bytes::from(vec![7u8; n * 4]) });
        m.chunks.push(Chunk::bytes(Bytes::from_static(b"abc")));
        m
    }

    #[tokio::test]
    async fn round_trip_through_a_small_pipe() {
        // A 1 KiB pipe forces partial vectored writes and many partial reads.
        let (a, b) = tokio::io::duplex(1024);
        let mut tx = Connection::new(a, "a", Limits::default());
        let mut rx = Connection::new(b, "b", Limits::default());
        let sent = vec![big_message(10_000), Message::new(Command::Heartbeat), big_message(3)];
        let expect = sent.clone();
        let writer = tokio::spawn(async move {
            for m in &sent {
                tx.write_message(m).await.unwrap();
            }
        });
        for m in expect {
            assert_eq!(rx.read_message().await.unwrap(), Some(m));
        }
        writer.await.unwrap();
        assert!(rx.read_message().await.unwrap().is_none(), "clean EOF after the writer is dropped");
    }

    #[tokio::test]
    async fn a_large_frame_reuses_the_last_large_frames_allocation_once_dropped() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut tx = Connection::new(a, "a", Limits::default());
        let mut rx = Connection::new(b, "b", Limits::default());
        let (go_tx, mut go_rx) = tokio::sync::mpsc::channel::<()>(1);
        let writer = tokio::spawn(async move {
            for _ in 0..3 {
                tx.write_message(&big_message(1 << 19)).await.unwrap();
                go_rx.recv().await;
            }
        });
        let first = rx.read_message().await.unwrap().unwrap();
        let start = first.chunks[0].data.as_ptr() as usize;
        let span = 2 * first.chunks[0].data.len();
        drop(first);
        go_tx.send(()).await.unwrap();
        let second = rx.read_message().await.unwrap().unwrap();
        let at = second.chunks[0].data.as_ptr() as usize;
        assert!(at >= start - 64 && at < start + span, "the second frame lands in the first one's allocation");
        assert_eq!(second, big_message(1 << 19));
        go_tx.send(()).await.unwrap();
        // The second frame is still held: the third one is read elsewhere, intact.
        assert_eq!(rx.read_message().await.unwrap().unwrap(), big_message(1 << 19));
        go_tx.send(()).await.unwrap();
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn eof_mid_frame_is_an_error() {
        let (mut a, b) = tokio::io::duplex(1024);
        let bytes = Message::new(Command::Heartbeat).encode_to_bytes(&Limits::default()).unwrap();
        a.write_all(&bytes[..bytes.len() - 3]).await.unwrap();
        drop(a);
        let mut rx = Connection::new(b, "peer-x", Limits::default());
        let err = rx.read_message().await.unwrap_err();
        assert!(matches!(err, Error::EofMidFrame { .. }), "{err}");
        assert!(err.to_string().contains("peer-x"));
    }

    #[tokio::test]
    async fn oversized_frame_is_refused_without_reserving_it() {
        let (mut a, b) = tokio::io::duplex(1024);
        let limits = Limits { max_frame_bytes: 1 << 20, ..Limits::default() };
        let mut header = BytesMut::new();
        Header { body_len: 1 << 30, ..Header::decode(&Message::new(Command::Push).encode_to_bytes(&limits).unwrap(), &limits).unwrap() }
            .encode_into(&mut header);
        a.write_all(&header).await.unwrap();
        let mut rx = Connection::new(b, "p", limits);
        assert!(matches!(rx.read_message().await, Err(Error::Protocol { .. })));
        assert!(rx.reader.buffer.capacity() < 1 << 20);
    }
}

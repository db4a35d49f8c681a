//! [`Connection`]: one framed byte stream to a peer, split into a [`FrameReader`] and a
//! [`FrameWriter`] so one task can read while another writes (`reader.rs`, `writer.rs`).

use std::fmt;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use super::reader::FrameReader;
use super::seal::Seal;
use super::shm::{Incoming, Outgoing};
use super::writer::FrameWriter;
use super::writer::ShmOut;
use crate::ps::proto::{Limits, Message};
use crate::ps::Result;

/// One framed stream to a peer.
pub struct Connection {
    reader: FrameReader,
    writer: FrameWriter,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection").field("peer", &self.reader.peer()).finish_non_exhaustive()
    }
}

impl Connection {
    /// Wraps `stream`; `peer` names the other end in errors and logs.
    pub fn new<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(stream: S, peer: impl Into<String>, limits: Limits) -> Connection {
        let (r, w) = tokio::io::split(stream);
        let peer: Arc<str> = Arc::from(peer.into());
        Connection { reader: FrameReader::new(Box::new(r), peer.clone(), limits), writer: FrameWriter::new(Box::new(w), peer, limits) }
    }

    /// The peer's name (address, or what the owner set with [`set_peer`](Connection::set_peer)).
    pub fn peer(&self) -> &str {
        self.reader.peer()
    }

    /// Renames the peer (e.g. once it registered as a node).
    pub fn set_peer(&mut self, peer: impl Into<String>) {
        let peer: Arc<str> = Arc::from(peer.into());
        self.reader.set_peer(peer.clone());
        self.writer.set_peer(peer);
    }

    /// The limits applied to frames in both directions.
    pub fn limits(&self) -> Limits {
        self.reader.limits()
    }

    /// Replaces the limits (e.g. tighter ones during the handshake).
    pub fn set_limits(&mut self, limits: Limits) {
        self.reader.set_limits(limits);
        self.writer.set_limits(limits);
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

    /// Seals every later frame in both directions with `seal` (after a handshake).
    pub fn set_seal(&mut self, seal: Seal) {
        let seal = Arc::new(seal);
        self.reader.set_seal(Arc::clone(&seal));
        self.writer.set_seal(seal);
    }

    /// Reads frames flagged `SHM` from the peer's segment `incoming` and writes the bulk
    /// bytes of data frames into this side's `outgoing` (which the peer mapped).
    pub fn set_shm(&mut self, outgoing: Outgoing, incoming: Incoming) {
        self.reader.set_shm(incoming);
        let _ = self.writer.shm_slot().set(ShmOut { own: outgoing, broadcast: None });
    }

    /// Reads frames flagged `SHM | BROADCAST` from the peer's broadcast segment, in which this
    /// receiver is `bit`.
    pub fn set_broadcast(&mut self, segment: Incoming, bit: u32) {
        self.reader.set_broadcast(segment, bit);
    }

    /// Splits into independently usable halves.
    pub fn into_split(self) -> (FrameReader, FrameWriter) {
        (self.reader, self.writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::proto::Header;
    use crate::ps::proto::{Chunk, Command, DTypeCode, Flags};
    use crate::ps::transport::{Ingress, Landing, Target};
    use crate::ps::Error;
    use bytes::{Bytes, BytesMut};
    use std::sync::Arc;
    use tokio::io::AsyncWriteExt;

    fn big_message(n: usize) -> Message {
        let mut m = Message::new(Command::Push);
        m.meta.keys = vec![1, 2];
        m.meta.lens = vec![(n * 4) as u64, 3];
        m.chunks.push(Chunk { dtype: DTypeCode::F32, data: Bytes::from(vec![7u8; n * 4]) });
        m.chunks.push(Chunk::bytes(Bytes::from_static(b"abc")));
        m
    }

    /// A reply to request `id` with one f32 chunk per length, element `e` of chunk `c` being
    /// `c * 1000 + e`.
    fn reply(id: u64, lens: &[usize]) -> Message {
        let mut m = Message::new(Command::Reply).with_request_id(id);
        for (c, &n) in lens.iter().enumerate() {
            let values: Vec<f32> = (0..n).map(|e| (c * 1000 + e) as f32).collect();
            m.meta.push_key(c as u64, (n * 4) as u64, 0);
            m.chunks.push(Chunk { dtype: DTypeCode::F32, data: Bytes::copy_from_slice(bytemuck::cast_slice(&values)) });
        }
        m
    }

    fn landing(lens: &[usize]) -> Arc<Landing> {
        Arc::new(Landing::new(lens.iter().map(|&n| (DTypeCode::F32, Box::new(vec![0u8; n * 4]) as Box<dyn Target>)).collect()))
    }

    fn landed_bytes(l: &Landing) -> Vec<Vec<u8>> {
        l.targets().as_ref().expect("targets given back").iter().map(|t| t.bytes().to_vec()).collect()
    }

    #[tokio::test]
    async fn a_reply_lands_straight_in_its_targets_and_anything_else_is_read_as_usual() {
        // A 1 KiB pipe: the head, each chunk and its padding arrive in many pieces; the odd
        // lengths need padding.
        let (a, b) = tokio::io::duplex(1024);
        let mut tx = Connection::new(a, "a", Limits::default());
        let (mut rx, _w) = Connection::new(b, "b", Limits::default()).into_split();
        let lens = [30_001, 9_999];
        let (lands, other, small) = (landing(&lens), landing(&[30_001, 10_000]), landing(&[100]));
        let sent = vec![
            reply(7, &lens),
            Message::new(Command::Heartbeat),
            reply(8, &lens),  // registered with other lengths: read as usual
            reply(9, &[100]), // too small to land
            reply(10, &lens), // nothing registered
        ];
        let expect = sent.clone();
        let writer = tokio::spawn(async move {
            for m in &sent {
                tx.write_message(m).await.unwrap();
            }
        });
        let (l7, l8, l9) = (Arc::clone(&lands), Arc::clone(&other), Arc::clone(&small));
        let lookup = move |id: u64| match id {
            7 => Some(Arc::clone(&l7)),
            8 => Some(Arc::clone(&l8)),
            9 => Some(Arc::clone(&l9)),
            _ => None,
        };
        let ingress = Ingress::new(1 << 20);
        let (first, _) = rx.read_landing(&ingress, &lookup).await.unwrap().unwrap();
        assert!(first.flags.contains(Flags::LANDED));
        assert_eq!(first.meta, expect[0].meta);
        assert!(first.chunks.iter().all(|c| c.data.is_empty() && c.dtype == DTypeCode::F32));
        let want: Vec<Vec<u8>> = expect[0].chunks.iter().map(|c| c.data.to_vec()).collect();
        assert_eq!(landed_bytes(&lands), want, "each chunk in its own target");
        for m in &expect[1..] {
            let (got, _) = rx.read_landing(&ingress, &lookup).await.unwrap().unwrap();
            assert_eq!(&got, m, "read the usual way");
        }
        assert!(landed_bytes(&other).iter().chain(&landed_bytes(&small)).all(|t| t.iter().all(|b| *b == 0)), "untouched");
        writer.await.unwrap();
        assert!(rx.read_landing(&ingress, &lookup).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_landing_reply_with_bad_padding_is_refused() {
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let (mut rx, _w) = Connection::new(b, "b", Limits::default()).into_split();
        let mut frame = reply(7, &[30_001]).encode_to_bytes(&Limits::default()).unwrap().to_vec();
        *frame.last_mut().unwrap() = 1;
        a.write_all(&frame).await.unwrap();
        let lands = landing(&[30_001]);
        let l = Arc::clone(&lands);
        let lookup = move |_: u64| Some(Arc::clone(&l));
        let e = rx.read_landing(&Ingress::new(1 << 20), &lookup).await.unwrap_err();
        assert!(matches!(e, Error::Protocol { .. }), "{e}");
        assert!(lands.targets().is_some(), "the targets went back to the landing");
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
    async fn a_large_frame_reuses_an_earlier_large_frames_allocation_once_dropped() {
        use super::super::reader::Ingress;
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut tx = Connection::new(a, "a", Limits::default());
        let mut rx = Connection::new(b, "b", Limits::default());
        let ingress = Ingress::new(64 << 20);
        let (go_tx, mut go_rx) = tokio::sync::mpsc::channel::<()>(1);
        let writer = tokio::spawn(async move {
            for _ in 0..3 {
                tx.write_message(&big_message(1 << 19)).await.unwrap();
                go_rx.recv().await;
            }
        });
        let (first, _) = rx.reader.read_admitted(&ingress).await.unwrap().unwrap();
        let start = first.chunks[0].data.as_ptr() as usize;
        let span = 2 * first.chunks[0].data.len();
        drop(first);
        assert_eq!(ingress.free_pooled(), 1, "the dropped frame's allocation waits in the pool");
        go_tx.send(()).await.unwrap();
        let (second, _) = rx.reader.read_admitted(&ingress).await.unwrap().unwrap();
        let at = second.chunks[0].data.as_ptr() as usize;
        assert!(at >= start - 64 && at < start + span, "the second frame lands in the first one's allocation");
        assert_eq!(ingress.free_pooled(), 0, "taken from the pool (and the second frame is held)");
        assert_eq!(second, big_message(1 << 19));
        go_tx.send(()).await.unwrap();
        // The second frame is still held: the third one is read elsewhere, intact.
        assert_eq!(rx.reader.read_admitted(&ingress).await.unwrap().unwrap().0, big_message(1 << 19));
        go_tx.send(()).await.unwrap();
        writer.await.unwrap();
    }

    /// The pool keeps allocations up to the budget, or up to what `pooling` allows: of three
    /// frames of a little over 1 MiB, read under a 3 MiB budget (each released before the next
    /// is admitted) but all held by the consumer, as a server holds pushes unsummed, two wait
    /// in the pool once dropped, and all three when it may keep 6 MiB.
    #[tokio::test]
    async fn a_pool_larger_than_the_budget_keeps_frames_held_past_their_admission() {
        use super::super::reader::Ingress;
        for (ingress, kept) in [(Ingress::new(3 << 20), 2), (Ingress::new(3 << 20).pooling(6 << 20), 3)] {
            let (a, b) = tokio::io::duplex(1 << 16);
            let mut tx = Connection::new(a, "a", Limits::default());
            let mut rx = Connection::new(b, "b", Limits::default());
            let writer = tokio::spawn(async move {
                for _ in 0..3 {
                    tx.write_message(&big_message(1 << 18)).await.unwrap();
                }
            });
            let mut held = Vec::new();
            for _ in 0..3 {
                let (frame, admission) = rx.reader.read_admitted(&ingress).await.unwrap().unwrap();
                drop(admission);
                held.push(frame);
            }
            writer.await.unwrap();
            drop(held);
            assert_eq!(ingress.free_pooled(), kept, "pool of {} frames' worth", kept);
        }
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

    fn header_announcing(body_len: u64, limits: &Limits) -> BytesMut {
        let mut header = BytesMut::new();
        let any = Message::new(Command::Push).encode_to_bytes(limits).unwrap();
        Header { body_len, ..Header::decode(&any, limits).unwrap() }.encode_into(&mut header);
        header
    }

    #[tokio::test]
    async fn oversized_frame_is_refused_without_reserving_it() {
        let (mut a, b) = tokio::io::duplex(1024);
        let limits = Limits { max_frame_bytes: 1 << 20, ..Limits::default() };
        a.write_all(&header_announcing(1 << 30, &limits)).await.unwrap();
        let mut rx = Connection::new(b, "p", limits);
        assert!(matches!(rx.read_message().await, Err(Error::Protocol { .. })));
        assert!(rx.reader.reserved() < 1 << 20);
    }

    #[tokio::test]
    async fn an_announced_frame_reserves_only_what_arrived() {
        // A 512 MiB frame is announced (within the limits), then 100 KiB arrive and the peer
        // stalls: the reader holds about what arrived, not the announced size.
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let limits = Limits::default();
        a.write_all(&header_announcing(512 << 20, &limits)).await.unwrap();
        a.write_all(&vec![0u8; 100 << 10]).await.unwrap();
        let mut rx = Connection::new(b, "p", limits);
        let read = tokio::time::timeout(std::time::Duration::from_millis(200), rx.read_message()).await;
        assert!(read.is_err(), "still waiting for the rest of the frame");
        assert!(rx.reader.buffered() >= 100 << 10);
        assert!(rx.reader.reserved() < 1 << 20, "reserved {} bytes for 100 KiB received", rx.reader.reserved());
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_pausing_inside_a_frame_times_out_but_silence_between_frames_is_fine() {
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let mut rx = Connection::new(b, "slow", Limits::default());
        rx.reader.set_stall_timeout(Some(std::time::Duration::from_secs(5)));
        let quiet = tokio::time::timeout(std::time::Duration::from_secs(60), rx.read_message()).await;
        assert!(quiet.is_err(), "no frame started: the reader just waits");
        a.write_all(&header_announcing(1 << 20, &Limits::default())).await.unwrap();
        let err = rx.read_message().await.unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }) && err.to_string().contains("rest of a frame"), "{err}");
    }

    #[tokio::test]
    async fn an_ingress_budget_holds_back_frames_until_admitted_ones_are_released() {
        use super::super::reader::Ingress;
        let (a, b) = tokio::io::duplex(1 << 22);
        let mut tx = Connection::new(a, "a", Limits::default());
        let mut rx = Connection::new(b, "b", Limits::default());
        tokio::spawn(async move {
            for _ in 0..2 {
                tx.write_message(&big_message(300_000)).await.unwrap();
            }
        });
        let ingress = Ingress::new(1_500_000);
        let (first, admitted) = rx.reader.read_admitted(&ingress).await.unwrap().unwrap();
        assert_eq!(first, big_message(300_000));
        assert!(ingress.available() < 400_000, "the first frame holds its 1.2 MB");
        let second = tokio::time::timeout(std::time::Duration::from_millis(200), rx.reader.read_admitted(&ingress)).await;
        assert!(second.is_err(), "no room for the second frame while the first is held");
        assert!(rx.reader.buffered() < 1 << 20, "and it was not read ahead");
        drop(admitted);
        let (second, _) = rx.reader.read_admitted(&ingress).await.unwrap().unwrap();
        assert_eq!(second, big_message(300_000));
    }

    #[tokio::test]
    async fn data_frames_travel_through_shared_memory_and_a_forged_shm_frame_is_refused() {
        use super::super::shm::{Incoming, Outgoing};
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut tx = Connection::new(a, "a", Limits::default());
        let mut rx = Connection::new(b, "b", Limits::default());
        let (a_out, b_out) = (Outgoing::create(1 << 20).unwrap(), Outgoing::create(1 << 20).unwrap());
        let (a_in, b_in) = (Incoming::open(&b_out.offer()).unwrap(), Incoming::open(&a_out.offer()).unwrap());
        tx.set_shm(a_out, a_in);
        rx.set_shm(b_out, b_in);
        let big = big_message(100_000);
        let shm_bytes = || crate::ps::metrics::METRICS.transport.shm_bytes.get();
        let before = shm_bytes();
        let writer = tokio::spawn(async move {
            tx.write_message(&big_message(100_000)).await.unwrap();
            tx.write_message(&big_message(3)).await.unwrap(); // small: on the stream
            tx
        });
        assert_eq!(rx.read_message().await.unwrap(), Some(big));
        assert_eq!(rx.read_message().await.unwrap(), Some(big_message(3)));
        let mut tx = writer.await.unwrap();
        assert!(shm_bytes() >= before + 400_000, "the big frame's chunks went through shared memory");
        // A frame flagged SHM on a connection whose reader has no segment.
        let (c, d) = tokio::io::duplex(1 << 16);
        let mut plain = Connection::new(d, "plain", Limits::default());
        let mut forged = big_message(1);
        forged.flags = crate::ps::proto::Flags::SHM;
        forged.meta.lens = vec![28, 4];
        forged.chunks = vec![Chunk::bytes(Bytes::from(vec![0u8; 32])), Chunk::bytes(Bytes::from(vec![0u8; 32]))];
        let mut raw = Connection::new(c, "forger", Limits::default());
        raw.write_message(&forged).await.unwrap();
        assert!(matches!(plain.read_message().await, Err(Error::Protocol { .. })));
        // And descriptors that name no slot, on a connection that has one.
        tx.write_message(&forged).await.unwrap();
        assert!(matches!(rx.read_message().await, Err(Error::Protocol { .. })));
    }

    /// Sends `answer` from a server connection to each of two worker connections that joined
    /// `broadcast`, and returns what the workers read.
    async fn answer_two_local_workers(broadcast: &std::sync::Arc<super::super::shm::Broadcast>, answer: &Message) -> Vec<Message> {
        use super::super::shm::{Incoming, Outgoing};
        let mut received = Vec::new();
        for _ in 0..2 {
            let (a, b) = tokio::io::duplex(1 << 16);
            let mut server = Connection::new(a, "server", Limits::default());
            let mut worker = Connection::new(b, "worker", Limits::default());
            let (s_out, w_out) = (Outgoing::create(1 << 20).unwrap(), Outgoing::create(1 << 20).unwrap());
            let member = broadcast.join(std::process::id()).unwrap();
            worker.set_shm(w_out, Incoming::open(&s_out.offer()).unwrap());
            worker.set_broadcast(Incoming::open(&member.segment_offer()).unwrap(), member.bit());
            server.reader.set_shm(Incoming::open(&worker.writer.shm_slot().get().unwrap().own.offer()).unwrap());
            let _ = server.writer.shm_slot().set(ShmOut { own: s_out, broadcast: Some(member) });
            let sent = answer.clone();
            let writer = tokio::spawn(async move {
                server.write_message(&sent).await.unwrap();
                server
            });
            received.push(worker.read_message().await.unwrap().unwrap());
            drop(writer.await.unwrap());
        }
        received
    }

    #[tokio::test]
    async fn an_answer_of_many_values_to_several_local_workers_is_copied_once_into_one_broadcast_slot() {
        let broadcast = super::super::shm::Broadcast::create(4 << 20).unwrap();
        let mut answer = Message::new(Command::Reply);
        answer.meta.keys = vec![5, 6, 7];
        let sizes = [40_000usize, 4, 100_000];
        answer.meta.lens = sizes.iter().map(|n| *n as u64).collect();
        answer.chunks =
            sizes.iter().enumerate().map(|(k, n)| Chunk { dtype: DTypeCode::F32, data: Bytes::from(vec![k as u8 + 1; *n]) }).collect();
        let shared = || crate::ps::metrics::METRICS.transport.shm_broadcast.get();
        let before = shared();
        let received = answer_two_local_workers(&broadcast, &answer).await;
        assert!(received.iter().all(|m| *m == answer), "both workers read the answer");
        assert!(shared() >= before + 2, "both went through the broadcast segment");
        // One slot: the three values, each 64-byte aligned, after one header.
        assert_eq!(broadcast.in_use(), 64 + 40_000 + 64 + 100_032, "copied once, held by both workers");
        drop(received);
        assert_eq!(broadcast.in_use(), 0, "free once both let go (and their connections closed)");
    }

    #[tokio::test]
    async fn an_answer_to_several_local_workers_is_copied_once_into_the_broadcast_segment() {
        use super::super::shm::{Broadcast, Incoming, Outgoing};
        let broadcast = Broadcast::create(4 << 20).unwrap();
        let mut answer = Message::new(Command::Reply);
        answer.meta.keys = vec![5];
        answer.meta.lens = vec![1 << 20];
        answer.chunks.push(Chunk { dtype: DTypeCode::F32, data: Bytes::from(vec![3u8; 1 << 20]) });
        let shared = || crate::ps::metrics::METRICS.transport.shm_broadcast.get();
        let before = shared();
        let received = answer_two_local_workers(&broadcast, &answer).await;
        assert!(received.iter().all(|m| *m == answer), "both workers read the answer");
        assert!(shared() >= before + 2, "both went through the broadcast segment");
        let one_slot = (1 << 20) + 64;
        assert_eq!(broadcast.in_use(), one_slot, "copied once, held by both workers");
        drop(received);
        assert_eq!(broadcast.in_use(), 0, "free once both let go (and their connections closed)");
        // A frame flagged BROADCAST to a reader that has no broadcast segment.
        let (c, d) = tokio::io::duplex(1 << 16);
        let mut plain = Connection::new(d, "plain", Limits::default());
        let (p_out, p_in) = (Outgoing::create(1 << 20).unwrap(), Outgoing::create(1 << 20).unwrap());
        plain.set_shm(p_out, Incoming::open(&p_in.offer()).unwrap());
        let mut forged = Message::new(Command::Reply);
        forged.flags = crate::ps::proto::Flags::SHM.with(crate::ps::proto::Flags::BROADCAST);
        forged.meta.keys = vec![5];
        forged.meta.lens = vec![64];
        forged.chunks = vec![Chunk::bytes(Bytes::from(vec![0u8; 32]))];
        let mut raw = Connection::new(c, "forger", Limits::default());
        raw.write_message(&forged).await.unwrap();
        assert!(matches!(plain.read_message().await, Err(Error::Protocol { .. })));
    }
}

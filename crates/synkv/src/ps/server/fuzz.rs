//! An entry point for coverage-guided fuzzing of the server's request handling (only in
//! builds with `--cfg fuzzing`, which `cargo afl` and `cargo fuzz` set, and in tests).
//!
//! [`handle_frames`] cuts its input into frames with the wire decoder and hands every frame
//! that decodes to a server core, as a request from one of two workers, after a few keys were
//! initialised (dense f32 and f16, row_sparse, and a key in two parts); the answers are
//! drained and dropped (`Checkpoint` commands are skipped: they would write files where the
//! input says). Whatever the input, this must not panic, loop forever or grow without
//! bound: the core validates every request before changing anything.

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::core::{Core, Event, Settings};
use crate::ps::node::NodeId;
use crate::ps::proto::{check, parse, Chunk, Command, DTypeCode, Flags, Limits, Message};
use crate::ps::transport::{Admission, Outbox};

fn f32_chunk(v: &[f32]) -> Chunk {
    Chunk { dtype: DTypeCode::F32, data: Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()) }
}

/// Feeds every decodable frame of `data` to a fresh server core (see the module docs).
pub fn handle_frames(data: &[u8]) {
    let settings = Settings {
        rank: 0,
        num_servers: 1,
        num_workers: 2,
        held_budget: 1 << 12,
        straggler_warn: std::time::Duration::from_secs(60),
        page_bytes: 1 << 12,
        replicas: false,
        shared: None,
        threads: super::core::UpdateThreads::One,
    };
    let mut core = Core::new(NodeId(8), settings);
    let (outbox, mut rx) = Outbox::bounded(1 << 12, 1 << 24);
    for conn in 0..2 {
        core.on_event(Event::Opened { conn, outbox: outbox.clone(), close: CancellationToken::new() });
    }
    // Keys 1 (4 × f32), 2 (a row_sparse 3 × 2), 3 (in two parts: offsets 0 and 4).
    let mut init = Message::new(Command::Push).with_flags(Flags::INIT);
    init.meta.push_key(1, 16, 0);
    init.chunks.push(f32_chunk(&[0.0; 4]));
    init.meta.push_key(3, 16, 0);
    init.chunks.push(f32_chunk(&[1.0; 4]));
    init.meta.push_key(3, 8, 4);
    init.chunks.push(f32_chunk(&[2.0; 2]));
    init.meta.text = r#"["a","c","c"]"#.into();
    let mut rows = Message::new(Command::Push).with_flags(Flags::INIT.with(Flags::ROW_SPARSE));
    rows.meta.push_key(2, 24 + 24, 0);
    rows.chunks
        .push(Chunk { dtype: DTypeCode::I64, data: Bytes::from([0i64, 1, 2].iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()) });
    rows.chunks.push(f32_chunk(&[0.0; 6]));
    for (id, msg) in [init, rows].into_iter().enumerate() {
        let msg = msg.with_request_id(id as u64).with_sender(NodeId(9));
        core.on_event(Event::Request { conn: 0, worker: 0, msg, admission: Admission::default() });
    }
    let limits = Limits { max_frame_bytes: 1 << 20, ..Limits::default() };
    let mut rest = data;
    let mut turn = 0u64;
    while let Ok(Some(len)) = check(rest, &limits) {
        let (frame, tail) = rest.split_at(len);
        rest = tail;
        // A `Checkpoint` command writes files where its body says: not on a fuzzing machine.
        let checkpoint = |m: &Message| m.command == Command::ServerCommand && m.meta.head == super::ServerCmd::Checkpoint.id();
        if let Some(msg) = parse(Bytes::copy_from_slice(frame), &limits).ok().filter(|m| !checkpoint(m)) {
            let worker = u32::try_from(turn % 2).unwrap_or(0);
            core.on_event(Event::Request { conn: u64::from(worker), worker, msg, admission: Admission::default() });
        }
        turn += 1;
        if turn.is_multiple_of(4) {
            core.on_event(Event::Tick);
        }
        while rx.try_recv().is_some() {}
    }
    core.on_event(Event::WorkersDone(crate::ps::cluster::Absent::new([1], 1)));
    while rx.try_recv().is_some() {}
}

#[cfg(test)]
mod tests {
    #[test]
    fn arbitrary_bytes_and_valid_requests_never_panic() {
        super::handle_frames(b"");
        super::handle_frames(&[0xff; 100]);
        let mut pull = crate::ps::proto::Message::new(crate::ps::proto::Command::Pull);
        pull.meta.push_key(1, 16, 0);
        let bytes = pull.encode_to_bytes(&crate::ps::proto::Limits::default()).unwrap();
        super::handle_frames(&bytes);
    }
}

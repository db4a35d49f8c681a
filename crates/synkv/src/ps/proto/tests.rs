//! Unit tests for the codec's own invariants (round trip, zero-copy chunks, alignment,
//! incomplete input, encoder refusals, control accessors). One rejection test per wire rule
//! lives in `tests/proto_reject.rs`; the proptests in `tests/proto_roundtrip.rs`.

use bytes::{Bytes, BytesMut};

use super::*;
use crate::ps::node::{Node, NodeId, Role};
fn limits() -> Limits {
    Limits::default()
}

fn sample() -> Message {
    let mut m = Message::new(Command::Push).with_request_id(7).with_sender(NodeId(9)).with_flags(Flags::REQUEST);
    m.meta.keys = vec![3, 5];
    m.meta.lens = vec![8, 4];
    m.meta.priority = -2;
    m.meta.text = "hi".into();
    m.meta.nodes.push(Node::unassigned(Role::Worker, "127.0.0.1", 4000, Some(1)));
    m.chunks.push(Chunk { dtype: DTypeCode::F32, data: Bytes::from_static(&[1, 2, 3, 4, 5, 6, 7, 8]) });
    m.chunks.push(Chunk { dtype: DTypeCode::U8, data: Bytes::from_static(&[9, 9, 9, 9]) });
    m
}

fn frame(m: &Message) -> BytesMut {
    BytesMut::from(&m.encode_to_bytes(&limits()).unwrap()[..])
}

#[test]
fn round_trip_sample() {
    let m = sample();
    let b = frame(&m);
    assert_eq!(b.len() % 8, 0);
    assert_eq!(check(&b, &limits()), Ok(Some(b.len())));
    assert_eq!(parse(b.freeze(), &limits()), Ok(m));
}

#[test]
fn chunks_are_zero_copy_slices_of_the_frame() {
    let b = frame(&sample()).freeze();
    let m = parse(b.clone(), &limits()).unwrap();
    let range = b.as_ptr_range();
    assert!(range.contains(&m.chunks[0].data.as_ptr()));
    assert_eq!((m.chunks[0].data.as_ptr() as usize - b.as_ptr() as usize) % 8, 0, "chunks are 8-byte aligned in the frame");
}

#[test]
fn incomplete_is_not_an_error() {
    let b = frame(&sample());
    for n in 0..b.len() {
        assert_eq!(check(&b[..n], &limits()), Ok(None), "prefix {n}");
    }
}

#[test]
fn encode_refuses_what_decode_would_reject() {
    let mut m = sample();
    m.meta.lens.pop();
    assert!(matches!(m.encode_head(&limits()), Err(EncodeError::LengthMismatch { .. })));
    let mut m = sample();
    m.chunks[0].data = Bytes::from_static(&[0; 6]);
    assert!(matches!(m.encode_head(&limits()), Err(EncodeError::LengthMismatch { .. })));
    let m = sample();
    let tiny = Limits { max_frame_bytes: 64, ..limits() };
    assert!(matches!(m.encode_head(&tiny), Err(EncodeError::TooLarge { field: "body length", .. })));
}

#[test]
fn control_accessors_validate_shape() {
    let m = Message::new(Command::Register);
    assert!(m.single_node().is_err());
    let mut m = Message::new(Command::Barrier);
    m.meta.head = 9;
    assert!(m.group().is_err());
    assert_eq!(Message::new(Command::Hello).handshake(), Ok(None));
    let m = Message::hello(Role::Server, &[7; 48]);
    assert_eq!(m.handshake(), Ok(Some(&[7u8; 48][..])));
    assert_eq!(m.head_role(), Ok(Role::Server));
    assert_eq!(Message::hello(Role::Worker, &[]).handshake(), Ok(None));
    assert!(Message::welcome(&[1; 2000]).handshake().is_err(), "over 1 KiB");
}

#[test]
fn offsets_and_round_ids_travel_only_when_present() {
    let mut m = sample();
    let plain = frame(&m).len();
    m.meta.offsets = vec![0, 1 << 40];
    m.meta.rounds = vec![7, u64::MAX];
    let b = frame(&m);
    assert_eq!(b.len(), plain + 2 * 2 * 8, "two u64 per key for each array");
    let flags = Header::decode(&b, &limits()).unwrap().flags;
    assert!(flags.contains(Flags::OFFSETS) && flags.contains(Flags::ROUNDS), "the encoder sets the flags from the meta");
    assert_eq!(parse(b.freeze(), &limits()), Ok(m.clone()), "in memory the arrays say it, not the flags");
    let mut only_rounds = sample();
    only_rounds.meta.rounds = vec![1, 2];
    assert_eq!(parse(frame(&only_rounds).freeze(), &limits()), Ok(only_rounds));
}

#[test]
fn encode_refuses_misshapen_offsets_rounds_and_hand_set_flags() {
    let mut m = sample();
    m.meta.offsets = vec![1];
    assert!(matches!(m.encode_head(&limits()), Err(EncodeError::LengthMismatch { .. })));
    let mut m = sample();
    m.meta.rounds = vec![1, 2, 3];
    assert!(matches!(m.encode_head(&limits()), Err(EncodeError::LengthMismatch { .. })));
    let m = sample().with_flags(Flags::REQUEST.with(Flags::ROUNDS));
    assert!(matches!(m.encode_head(&limits()), Err(EncodeError::LengthMismatch { .. })));
}

#[test]
fn error_frames_carry_their_code() {
    let m = Message::coded_error(5, ErrorCode::DuplicatePush, "again");
    let back = parse(frame(&m).freeze(), &limits()).unwrap();
    assert_eq!(back.error_code(), ErrorCode::DuplicatePush);
    assert_eq!(Message::error(1, "x").error_code(), ErrorCode::Other);
}

#[test]
fn push_key_keeps_offsets_empty_until_one_is_not_zero() {
    let mut m = Meta::default();
    m.push_key(1, 8, 0);
    assert!(m.offsets.is_empty());
    m.push_key(2, 8, 720);
    m.push_key(3, 8, 0);
    assert_eq!(m.offsets, vec![0, 720, 0]);
    let mut first = Meta::default();
    first.push_key(9, 4, 5);
    assert_eq!((first.keys, first.offsets), (vec![9], vec![5]), "an offset on the first key");
}

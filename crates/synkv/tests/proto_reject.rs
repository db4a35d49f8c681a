//! One rejection test per wire rule of `ps::proto` (mini-redis's `frame_validation.rs`,
//! with limits): every malformed frame is a typed `DecodeError`, never a panic, and oversized
//! announcements are refused from the header alone, before any memory is reserved.

use bytes::{Bytes, BytesMut};

use synkv::ps::proto::*;
use synkv::ps::{Node, NodeId, Role};

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

fn reject(bytes: &[u8]) -> DecodeError {
    match check(bytes, &limits()) {
        Err(e) => e,
        Ok(Some(n)) => parse(Bytes::copy_from_slice(&bytes[..n]), &limits()).unwrap_err(),
        Ok(None) => panic!("frame reported incomplete"),
    }
}

fn set_u32(b: &mut BytesMut, at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn set_u64(b: &mut BytesMut, at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Offset of the meta field after the key/len/chunk tables in `sample()`.
const PRIORITY_AT: usize = HEADER_LEN + 2 * 16 + 2 * 9;

#[test]
fn reject_bad_magic_early() {
    assert_eq!(check(b"X", &limits()), Err(DecodeError::BadMagic));
    let mut b = frame(&sample());
    b[3] = b'2';
    assert_eq!(reject(&b), DecodeError::BadMagic);
}

#[test]
fn reject_version() {
    let mut b = frame(&sample());
    b[4] = 1;
    assert_eq!(reject(&b), DecodeError::UnsupportedVersion(1));
}

#[test]
fn reject_unknown_command() {
    let mut b = frame(&sample());
    b[6] = 15;
    assert_eq!(reject(&b), DecodeError::UnknownCommand(15));
}

#[test]
fn reject_unknown_flags() {
    // 0x100 is SHM, 0x200 BROADCAST: the first unknown bit is 0x400.
    let mut b = frame(&sample());
    b[9] = 0x04;
    assert_eq!(reject(&b), DecodeError::UnknownFlags(0x400));
}

/// Header offset 10 (reserved in version 2) is the partition since version 3: 0 = none.
#[test]
fn the_partition_field_is_read_not_refused() {
    let mut b = frame(&sample());
    b[10] = 3;
    let n = check(&b, &limits()).unwrap().unwrap();
    assert_eq!(parse(Bytes::copy_from_slice(&b[..n]), &limits()).unwrap().partition, Some(2));
}

/// The `OFFSETS` and `ROUNDS` flags announce per-key arrays; on a frame without keys they
/// would give one message two wire forms (fuzzing finding 1, docs/fuzzing.md).
#[test]
fn reject_offsets_or_rounds_flags_without_keys() {
    for flag in [0x10u8, 0x20, 0x30] {
        let mut b = frame(&Message::new(Command::Pull).with_request_id(1));
        b[8] |= flag;
        assert!(matches!(reject(&b), DecodeError::InvalidField { field: "flags OFFSETS/ROUNDS without keys", .. }), "{flag:#x}");
    }
}

#[test]
fn reject_too_many_keys_before_reading_body() {
    let mut b = frame(&sample());
    set_u32(&mut b, 24, limits().max_keys + 1);
    // Only the header is needed to refuse.
    assert!(matches!(check(&b[..HEADER_LEN], &limits()), Err(DecodeError::TooLarge { field: "key count", .. })));
}

#[test]
fn reject_too_many_chunks() {
    let mut b = frame(&sample());
    set_u32(&mut b, 28, limits().max_chunks + 1);
    assert!(matches!(check(&b[..HEADER_LEN], &limits()), Err(DecodeError::TooLarge { field: "chunk count", .. })));
}

#[test]
fn reject_oversized_body_before_allocating() {
    let mut b = frame(&sample());
    set_u64(&mut b, 32, !7);
    assert!(matches!(check(&b[..HEADER_LEN], &limits()), Err(DecodeError::TooLarge { field: "body length", .. })));
}

#[test]
fn reject_body_length_not_multiple_of_8() {
    let mut b = frame(&sample());
    let len = u64::try_from(b.len() - HEADER_LEN).unwrap() + 1;
    set_u64(&mut b, 32, len);
    assert!(matches!(check(&b[..HEADER_LEN], &limits()), Err(DecodeError::InvalidField { .. })));
}

#[test]
fn reject_key_count_larger_than_body() {
    let mut b = frame(&sample());
    set_u32(&mut b, 24, 1000);
    assert!(matches!(reject(&b), DecodeError::Truncated { .. }));
}

#[test]
fn reject_unknown_dtype() {
    let mut b = frame(&sample());
    b[HEADER_LEN + 2 * 16 + 2 * 8] = 13;
    assert_eq!(reject(&b), DecodeError::UnknownDType(13));
}

#[test]
fn reject_chunk_length_not_multiple_of_dtype() {
    let mut m = sample();
    m.meta.keys.clear();
    m.meta.lens.clear();
    m.chunks[0].data = Bytes::from_static(&[0; 6]);
    m.chunks[0].dtype = DTypeCode::U8;
    let mut b = frame(&m);
    b[HEADER_LEN + 2 * 8] = DTypeCode::F32.code();
    assert!(matches!(reject(&b), DecodeError::LengthMismatch { field: "chunk length and dtype size" }));
}

#[test]
fn reject_key_lengths_not_matching_chunks() {
    let mut b = frame(&sample());
    set_u64(&mut b, HEADER_LEN + 16, 9);
    assert!(matches!(reject(&b), DecodeError::LengthMismatch { field: "key lengths and chunk lengths" }));
}

#[test]
fn reject_too_many_nodes() {
    let mut b = frame(&sample());
    set_u32(&mut b, PRIORITY_AT + 8, limits().max_nodes + 1);
    assert!(matches!(reject(&b), DecodeError::TooLarge { field: "node count", .. }));
}

#[test]
fn reject_node_count_beyond_frame() {
    let mut b = frame(&sample());
    set_u32(&mut b, PRIORITY_AT + 8, 1000);
    assert!(matches!(reject(&b), DecodeError::Truncated { field: "nodes" }));
}

#[test]
fn reject_unknown_role() {
    let mut b = frame(&sample());
    b[PRIORITY_AT + 12] = 3;
    assert_eq!(reject(&b), DecodeError::UnknownRole(3));
}

#[test]
fn reject_nonzero_node_reserved() {
    let mut b = frame(&sample());
    b[PRIORITY_AT + 13] = 1;
    assert!(matches!(reject(&b), DecodeError::NonZeroPadding { field: "node reserved byte" }));
}

#[test]
fn reject_long_host() {
    let mut b = frame(&sample());
    set_u32(&mut b, PRIORITY_AT + 12 + 16, limits().max_string_len + 1);
    assert!(matches!(reject(&b), DecodeError::TooLarge { field: "node host", .. }));
}

#[test]
fn reject_long_text() {
    let mut m = sample();
    m.meta.text = "x".repeat(100);
    let small = Limits { max_string_len: 10, ..limits() };
    let b = m.encode_to_bytes(&limits()).unwrap();
    assert!(matches!(parse(b, &small), Err(DecodeError::TooLarge { field: "text", .. })));
    assert!(matches!(m.encode_to_bytes(&small), Err(EncodeError::TooLarge { field: "text length", .. })));
}

#[test]
fn reject_invalid_utf8() {
    let mut b = frame(&sample());
    let host_at = PRIORITY_AT + 12 + 20;
    b[host_at] = 0xff;
    assert!(matches!(reject(&b), DecodeError::InvalidUtf8 { field: "node host" }));
}

#[test]
fn reject_nonzero_padding() {
    let m = sample();
    let b = frame(&m);
    let meta_end = b.len() - 8 - 8; // chunk0 (8) + chunk1 (4 + 4 pad)
    let mut bad = b.clone();
    bad[meta_end - 1] = 1; // last meta padding byte ("hi" leaves padding)
    assert!(matches!(reject(&bad), DecodeError::NonZeroPadding { field: "meta padding" }));
    let mut bad = b;
    let last = bad.len() - 1;
    bad[last] = 1;
    assert!(matches!(reject(&bad), DecodeError::NonZeroPadding { field: "chunk padding" }));
}

#[test]
fn reject_trailing_bytes() {
    let mut m = sample();
    m.chunks.clear();
    m.meta.text.clear();
    let mut b = frame(&m);
    let body = u64::try_from(b.len() - HEADER_LEN).unwrap() + 8;
    set_u64(&mut b, 32, body);
    b.extend_from_slice(&[0; 8]);
    assert!(matches!(reject(&b), DecodeError::TrailingBytes { count: 8 }));
    // parse of a buffer longer than the frame
    let mut b = frame(&m);
    b.extend_from_slice(&[0; 8]);
    assert!(matches!(parse(b.freeze(), &limits()), Err(DecodeError::TrailingBytes { count: 8 })));
}

#[test]
fn reject_truncated_parse_input() {
    let b = frame(&sample()).freeze();
    assert!(matches!(parse(b.slice(..b.len() - 8), &limits()), Err(DecodeError::Truncated { .. })));
    assert!(matches!(parse(b.slice(..10), &limits()), Err(DecodeError::Truncated { field: "header" })));
}

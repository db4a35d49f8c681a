//! The checks behind synkv's fuzz targets, one function per target: [`frame`] (the wire
//! decoder), [`server`] (a server core's request handling) and [`codec`] (chunk codecs,
//! gradient compression, the optimizer-state file format and the JSON configurations).
//!
//! Each function takes arbitrary bytes and either returns or panics; a panic is a finding.
//! The afl binaries in `src/bin/` call them, and `crates/synkv/tests/fuzz_corpus.rs` includes
//! this file as a module to replay the committed corpus without afl, so the two cannot drift.
//! Nothing here may depend on more than `synkv` and the crates it depends on itself.
//!
//! What the targets deliberately do not do: drive sockets, timers or more than one server
//! core; see `docs/fuzzing.md` for what is not covered.

use bytes::Bytes;
use synkv::compression::{CompressionType, GradientCompression};
use synkv::ndarray::{Buffer, DType};
use synkv::optimizer::{GradRef, Optimizer, Updater, WeightMut};
use synkv::ps::codec;
use synkv::ps::proto::{check, parse, Chunk, DTypeCode, Limits};

/// Limits of the `frame` target: small enough that every `TooLarge` rule is reachable with
/// inputs of a few kilobytes.
pub const FRAME_LIMITS: Limits =
    Limits { max_frame_bytes: 1 << 20, max_keys: 1 << 10, max_chunks: 1 << 10, max_nodes: 64, max_string_len: 1 << 10 };

/// The wire decoder: every frame at the start of `data` (and of what follows it) is checked,
/// parsed, re-encoded and parsed again.
///
/// Asserts that a frame [`check`] accepts never makes [`parse`] panic; that a parsed message
/// re-encodes to exactly the bytes it came from and parses back to an equal message; that
/// every proper prefix of an accepted frame is incomplete (`Ok(None)`), never an error; and
/// that a buffer [`check`] refuses is refused by [`parse`] as well.
pub fn frame(data: &[u8]) {
    let limits = FRAME_LIMITS;
    if check(data, &limits).is_err() {
        assert!(parse(Bytes::copy_from_slice(data), &limits).is_err(), "check refuses what parse accepts");
    }
    let mut rest = data;
    while let Ok(Some(len)) = check(rest, &limits) {
        let (one, tail) = rest.split_at(len);
        rest = tail;
        for cut in [len - 1, len / 2, 3] {
            assert_eq!(
                check(&one[..cut.min(len - 1)], &limits),
                Ok(None),
                "a prefix of an accepted frame ({cut} of {len} bytes) is not incomplete"
            );
        }
        let bytes = Bytes::copy_from_slice(one);
        let Ok(msg) = parse(bytes.clone(), &limits) else { continue };
        let again = match msg.encode_to_bytes(&limits) {
            Ok(b) => b,
            Err(e) => panic!("a decoded message does not re-encode: {e}\n{msg:?}"),
        };
        assert!(again == bytes, "re-encoding changes the frame:\n  in:  {:02x?}\n  out: {:02x?}\n{msg:?}", &bytes[..], &again[..]);
        match parse(again, &limits) {
            Ok(back) => assert_eq!(back, msg, "the re-encoded frame parses to another message"),
            Err(e) => panic!("the re-encoded frame does not parse: {e}"),
        }
        // The typed accessors the control plane uses must refuse, never panic.
        let _ = (
            msg.single_node(),
            msg.group(),
            msg.head_role(),
            msg.handshake().map(|h| h.map(<[u8]>::len)),
            msg.head_node_id(),
            msg.error_code(),
        );
    }
}

/// A server core's request handling: every decodable frame of `data` goes to a core holding a
/// few keys, alternately from two workers (see `synkv::ps::server::fuzz`). Only built with
/// `--cfg fuzzing`, which `cargo afl build` sets; the entry point does not exist otherwise.
#[cfg(fuzzing)]
pub fn server(data: &[u8]) {
    synkv::ps::server::fuzz::handle_frames(data);
}

/// Reads the selector bytes of a `codec` input; past the end every byte reads as 0.
struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// A chunk of the given dtype from at most `max_bytes` of the input (a whole number of
    /// elements), placed `shift` bytes into its allocation so that misaligned views occur.
    fn chunk(&mut self, code: u8, shift: u8, max_bytes: usize) -> Chunk {
        let dtype = dtype_code(code);
        let size = usize::try_from(dtype.size()).unwrap_or(1);
        let raw = self.take(max_bytes);
        let raw = &raw[..raw.len() / size * size];
        let shift = usize::from(shift % 8);
        let mut backing = vec![0u8; shift];
        backing.extend_from_slice(raw);
        Chunk { dtype, data: Bytes::from(backing).slice(shift..) }
    }
}

/// Wire dtype number `code % 13`.
fn dtype_code(code: u8) -> DTypeCode {
    match DTypeCode::try_from(code % 13) {
        Ok(d) => d,
        Err(e) => unreachable!("codes 0..13 are dtypes: {e}"),
    }
}

/// Array dtype number `code % 6`.
fn dtype(code: u8) -> DType {
    DType::ALL[usize::from(code) % DType::ALL.len()]
}

fn f32s(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn words(raw: &[u8]) -> Vec<u32> {
    raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The value codecs. Byte 0 picks one of eight operations; the next bytes pick dtypes,
/// lengths and offsets, and the rest is the payload (see `fuzz/README.md` for the layout).
///
/// Asserts, besides never panicking: same-dtype conversions copy bytes exactly; accepted row
/// ids are sorted, unique and in range and re-encode to the same chunk; accepted copies and
/// adds had matching lengths; dequantized values are `±t`/`0` (2-bit) or `±1` (1-bit) and
/// `dequantize_add` onto zeros equals `dequantize`; a state file that loads saves to bytes
/// that load again and save identically; an optimizer JSON that parses survives a round trip.
pub fn codec(data: &[u8]) {
    let mut input = Input { data };
    match input.byte() % 8 {
        0 => chunk_to_buffer(&mut input),
        1 => row_ids(&mut input),
        2 => copy_or_add(&mut input),
        3 => sum_chunks(&mut input),
        4 => dequantize(&mut input),
        5 => quantize(&mut input),
        6 => state_file(&mut input),
        _ => configurations(input.data),
    }
}

fn chunk_to_buffer(input: &mut Input<'_>) {
    let (code, to, shift) = (input.byte(), input.byte(), input.byte());
    let chunk = input.chunk(code, shift, usize::MAX);
    let to = dtype(to);
    let Ok(buf) = codec::chunk_to_buffer(&chunk, to) else {
        assert!(codec::dtype_of(chunk.dtype).is_err(), "chunk_to_buffer refused an array dtype");
        return;
    };
    assert_eq!(buf.len(), codec::chunk_len(&chunk));
    if codec::dtype_of(chunk.dtype) == Ok(to) {
        assert_eq!(codec::buffer_bytes(&buf), &chunk.data[..], "a same-dtype conversion changed the bytes");
        assert_eq!(codec::buffer_to_bytes(&buf), chunk.data);
        assert_eq!(codec::range_to_chunk(&buf, 0, buf.len()), chunk);
    }
    if let Ok(words) = codec::words_of(&chunk) {
        assert_eq!(words.len() * 4, chunk.data.len());
    }
}

fn row_ids(input: &mut Input<'_>) {
    let (code, shift, rows) = (input.byte(), input.byte(), usize::from(input.u16()));
    let chunk = input.chunk(code, shift, usize::MAX);
    if let Ok(ids) = codec::ids_from_chunk(&chunk, rows) {
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "accepted ids are not sorted and unique: {ids:?}");
        assert!(ids.iter().all(|&i| usize::try_from(i).is_ok_and(|i| i < rows)), "accepted ids outside 0..{rows}: {ids:?}");
        assert_eq!(codec::ids_to_chunk(&ids), chunk);
    }
}

fn copy_or_add(input: &mut Input<'_>) {
    let (op, code, to, shift) = (input.byte(), input.byte(), input.byte(), input.byte());
    let (dst_len, off, len) = (usize::from(input.byte()), usize::from(input.byte()), usize::from(input.byte()));
    let chunk = input.chunk(code, shift, usize::MAX);
    let mut dst = Buffer::zeros(dtype(to), dst_len);
    let done =
        if op & 1 == 0 { codec::copy_chunk_into(&mut dst, off, len, &chunk) } else { codec::add_chunk_into(&mut dst, off, len, &chunk) };
    if done.is_ok() {
        assert_eq!(codec::chunk_len(&chunk), len, "accepted a chunk of another length");
        assert!(off + len <= dst_len, "accepted a range past the end");
    }
    assert_eq!(dst.len(), dst_len);
}

fn sum_chunks(input: &mut Input<'_>) {
    let (to, n, count) = (input.byte(), usize::from(input.byte() % 64), input.byte() % 5);
    let mut chunks = Vec::new();
    for _ in 0..count {
        let (code, shift, elems) = (input.byte(), input.byte(), usize::from(input.byte() % 64));
        let size = usize::try_from(dtype_code(code).size()).unwrap_or(1);
        chunks.push(input.chunk(code, shift, elems * size));
    }
    let mut dst = Buffer::zeros(dtype(to), n);
    if codec::sum_chunks_into(&mut dst, &chunks).is_ok() {
        assert!(chunks.iter().all(|c| codec::chunk_len(c) == n), "summed chunks of another length");
        if let [only] = chunks.as_slice() {
            if codec::dtype_of(only.dtype) == Ok(dst.dtype()) {
                assert_eq!(codec::buffer_bytes(&dst), &only.data[..], "the sum of one chunk is not that chunk");
            }
        }
    }
}

/// A compression configuration from two selector bytes and four threshold bytes; a 2-bit
/// threshold the constructor refuses falls back to MXNet's default.
fn compression(input: &mut Input<'_>) -> GradientCompression {
    let kind = if input.byte() & 1 == 0 { CompressionType::TwoBit } else { CompressionType::OneBit };
    let threshold = f32::from_le_bytes([input.byte(), input.byte(), input.byte(), input.byte()]);
    GradientCompression::new(kind, threshold)
        .or_else(|_| GradientCompression::new(kind, GradientCompression::DEFAULT_THRESHOLD))
        .unwrap_or_else(|e| unreachable!("the default threshold is valid: {e}"))
}

/// `n` from the input, and an output length equal to it or off by one or two.
fn lengths(input: &mut Input<'_>) -> (usize, usize) {
    let n = usize::from(input.u16() % 2048);
    let skew = input.byte();
    let out = match skew % 8 {
        0 => n + 1,
        1 => n.saturating_sub(1),
        2 => n + 2,
        _ => n,
    };
    (n, out)
}

fn assert_dequantized(gc: &GradientCompression, values: &[f32]) {
    let t = gc.threshold();
    let ok = |v: f32| match gc.kind() {
        CompressionType::TwoBit => v == t || v == -t || v == 0.0,
        CompressionType::OneBit => v == 1.0 || v == -1.0,
        // A scheme added later: no claim about its values here.
        _ => true,
    };
    if let Some(bad) = values.iter().find(|v| !ok(**v)) {
        panic!("{gc}: dequantized value {bad} is not one the scheme produces");
    }
}

fn dequantize(input: &mut Input<'_>) {
    let gc = compression(input);
    let (n, out_len) = lengths(input);
    let packed = words(input.data);
    let mut out = vec![f32::NAN; out_len];
    let plain = gc.dequantize(&packed, n, &mut out);
    let mut acc = vec![0.0f32; out_len];
    let added = gc.dequantize_add(&packed, n, &mut acc);
    assert_eq!(plain.is_ok(), added.is_ok(), "dequantize and dequantize_add disagree on the lengths");
    if plain.is_ok() {
        assert_eq!((packed.len(), out_len), (gc.compressed_len(n), n), "accepted wrong lengths");
        assert_dequantized(&gc, &out);
        assert_eq!(out, acc, "dequantize_add onto zeros differs from dequantize");
    }
}

fn quantize(input: &mut Input<'_>) {
    let gc = compression(input);
    let skew = input.byte();
    let grad = f32s(input.data);
    // A residual one too long, or one output word too many, must be refused.
    let (extra_residual, extra_words) = match skew % 8 {
        0 => (1, 0),
        1 => (0, 1),
        _ => (0, 0),
    };
    let mut residual = vec![0.0f32; grad.len() + extra_residual];
    let mut out = vec![0u32; gc.compressed_len(grad.len()) + extra_words];
    if gc.quantize(&grad, &mut residual, &mut out).is_ok() {
        let mut values = vec![0.0f32; grad.len()];
        if let Err(e) = gc.dequantize(&out, grad.len(), &mut values) {
            panic!("the words quantize wrote do not dequantize: {e}");
        }
        assert_dequantized(&gc, &values);
    }
}

/// Bytes of a state file from the payload, with its CRC-32 trailer recomputed when the
/// selector's low bit is set (random bytes almost never carry a valid checksum, which would
/// stop every input at the first check).
fn state_bytes(fix_crc: bool, payload: &[u8]) -> Vec<u8> {
    let mut bytes = payload.to_vec();
    if fix_crc && bytes.len() >= 4 {
        let body = bytes.len() - 4;
        let crc = crc32fast::hash(&bytes[..body]);
        bytes[body..].copy_from_slice(&crc.to_le_bytes());
    }
    bytes
}

fn state_file(input: &mut Input<'_>) {
    let (flags, skew) = (input.byte(), input.byte());
    let bytes = state_bytes(flags & 1 != 0, input.data);
    // Loading into an existing updater runs the same decoder plus the slot checks.
    let mut adam = Updater::new(Optimizer::adam());
    let _ = adam.merge_states(&bytes, flags & 2 != 0);
    let Ok(mut updater) = Updater::from_saved_states(&bytes) else { return };
    let saved = updater.save_states();
    let again = match Updater::from_saved_states(&saved) {
        Ok(u) => u,
        Err(e) => panic!("a loaded state file, saved again, does not load: {e}"),
    };
    assert!(again.save_states() == saved, "saving a loaded state file is not stable");
    // Every state must be refused or used by the next update, whatever its length.
    let mut keys: Vec<String> = updater.state_keys().map(str::to_owned).collect();
    keys.sort();
    for key in keys.iter().take(4) {
        let len = updater.state(key).map_or(0, |s| s.len());
        let len = match skew % 4 {
            0 => len + 1,
            1 => len.saturating_sub(1),
            _ => len,
        };
        let mut weight = vec![0.5f32; len];
        let grad = vec![0.25f32; len];
        let _ = updater.update(key, WeightMut::F32(&mut weight), GradRef::F32(&grad));
        let mut weight = vec![half::f16::from_f32(0.5); len];
        let grad = vec![half::f16::from_f32(0.25); len];
        let _ = updater.update(key, WeightMut::F16(&mut weight), GradRef::F16(&grad));
    }
}

/// The JSON and text configurations a peer or a file can hand us: optimizer descriptions
/// (`SetOptimizer`) and gradient-compression settings (a compressed push's text, the wire form).
fn configurations(payload: &[u8]) {
    let Ok(text) = std::str::from_utf8(payload) else { return };
    if let Ok(opt) = Optimizer::from_json(text) {
        let json = opt.to_json();
        match Optimizer::from_json(&json) {
            Ok(back) => assert_eq!(back.to_json(), json, "an optimizer description does not survive to_json/from_json"),
            Err(e) => panic!("to_json of a parsed optimizer does not parse: {e}\n{json}"),
        }
        let _ = opt.validate();
    }
    if let Ok(gc) = serde_json::from_str::<GradientCompression>(text) {
        let wire = gc.to_wire();
        match GradientCompression::from_wire(&wire) {
            Ok(back) => assert_eq!(back, gc, "{wire} reads back as another configuration"),
            Err(e) => panic!("the wire form {wire} of {gc} does not parse: {e}"),
        }
    }
    let _ = GradientCompression::from_wire(text);
}

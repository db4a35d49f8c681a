//! Writes the seed inputs of every target into `corpus/<target>/seed-*`: real frames made by
//! the encoder, request sequences for the server's fuzz core, codec inputs and state files
//! saved by an updater. Run from `fuzz/`: `cargo run --example seeds`. Seeds are deterministic,
//! so running it again rewrites the same files.
//!
//! After a change of `PROTOCOL_VERSION`, `cargo run --example seeds -- --restamp OLD` also
//! rewrites the frames of version `OLD` in the other `frame` and `server` inputs (corpus and
//! crashes) to the current version, since they would otherwise all stop at the header. Frames
//! of other versions (inputs that test the version rule) are left alone.

use std::path::Path;

use bytes::Bytes;
use synkv::compression::{CompressionType, GradientCompression};
use synkv::ndarray::Buffer;
use synkv::optimizer::{GradRef, LrScheduler, Optimizer, Updater, WeightMut};
use synkv::ps::codec;
use synkv::ps::proto::{Chunk, Command, DTypeCode, ErrorCode, Flags, Limits, Message, HEADER_LEN, MAGIC, PROTOCOL_VERSION};
use synkv::ps::{Group, Node, NodeId, Role, ServerCmd};

fn f32_chunk(v: &[f32]) -> Chunk {
    codec::range_to_chunk(&Buffer::from_vec(v.to_vec()), 0, v.len())
}

/// A dense data message: one f32 chunk per key.
fn data(command: Command, flags: Flags, keys: &[(u64, &[f32])]) -> Message {
    let mut m = Message::new(command).with_flags(flags);
    for (k, v) in keys {
        m.meta.push_key(*k, 4 * v.len() as u64, 0);
        m.chunks.push(f32_chunk(v));
    }
    m
}

fn pull(keys: &[(u64, u64, u64)]) -> Message {
    let mut m = Message::new(Command::Pull).with_flags(Flags::REQUEST);
    for (k, elems, offset) in keys {
        m.meta.push_key(*k, 4 * elems, *offset);
    }
    m
}

/// A row_sparse push (or pull, without rows) of key `k`.
fn rows(command: Command, k: u64, ids: &[i64], rows: &[f32]) -> Message {
    let mut m = Message::new(command).with_flags(Flags::ROW_SPARSE.with(Flags::REQUEST));
    let ids = codec::ids_to_chunk(ids);
    let mut len = ids.data.len() as u64;
    m.chunks.push(ids);
    if command != Command::Pull {
        len += 4 * rows.len() as u64;
        m.chunks.push(f32_chunk(rows));
    }
    m.meta.push_key(k, len, 0);
    m
}

fn compressed(k: u64, grad: &[f32]) -> Message {
    let gc = GradientCompression::new(CompressionType::TwoBit, 0.5).unwrap();
    let mut residual = vec![0.0; grad.len()];
    let mut words = vec![0u32; gc.compressed_len(grad.len())];
    gc.quantize(grad, &mut residual, &mut words).unwrap();
    let mut m = Message::new(Command::Push).with_flags(Flags::COMPRESSED.with(Flags::REQUEST));
    m.meta.text = serde_json::to_string(&gc).unwrap();
    let chunk = Chunk { dtype: DTypeCode::U32, data: Bytes::from(synkv::compression::words_to_bytes(&words)) };
    m.meta.push_key(k, chunk.data.len() as u64, 0);
    m.chunks.push(chunk);
    m
}

fn command(cmd: ServerCmd, body: &[u8], text: &str) -> Message {
    let mut m = Message::server_command(cmd.id(), Bytes::copy_from_slice(body)).with_flags(Flags::REQUEST);
    m.meta.text = text.into();
    m
}

fn adam() -> Optimizer {
    Optimizer::adam().with_learning_rate(0.01).with_wd(0.001)
}

/// A state file of `opt` after one update of key `key` with a weight of `len` elements.
fn states(opt: Optimizer, key: &str, len: usize, f16: bool) -> Vec<u8> {
    let mut u = Updater::try_new(opt).unwrap();
    let grad: Vec<f32> = (0..len).map(|i| i as f32 * 0.1 - 0.2).collect();
    if f16 {
        let mut w: Vec<half::f16> = (0..len).map(|i| half::f16::from_f32(i as f32)).collect();
        let g: Vec<half::f16> = grad.iter().map(|g| half::f16::from_f32(*g)).collect();
        u.update(key, WeightMut::F16(&mut w), GradRef::F16(&g)).unwrap();
    } else {
        let mut w: Vec<f32> = (0..len).map(|i| i as f32).collect();
        u.update(key, WeightMut::F32(&mut w), GradRef::F32(&grad)).unwrap();
    }
    u.save_states()
}

fn frames(msgs: &[Message]) -> Vec<u8> {
    let limits = Limits::default();
    msgs.iter().enumerate().flat_map(|(i, m)| m.clone().with_request_id(i as u64 + 1).encode_to_bytes(&limits).unwrap()).collect()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
}

/// Sets the version field of each frame of version `old` at the start of `bytes` to the
/// current one (frames follow each other by their body lengths; anything after the first
/// non-frame is left alone). Whether anything changed.
fn restamp(bytes: &mut [u8], old: u16) -> bool {
    let mut changed = false;
    let mut pos = 0usize;
    while bytes.len().saturating_sub(pos) >= HEADER_LEN && bytes[pos..pos + 4] == MAGIC {
        if bytes[pos + 4..pos + 6] == old.to_le_bytes() {
            bytes[pos + 4..pos + 6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
            changed = true;
        }
        let body = u64::from_le_bytes(bytes[pos + 32..pos + 40].try_into().unwrap());
        match usize::try_from(body).ok().and_then(|b| pos.checked_add(HEADER_LEN)?.checked_add(b)) {
            Some(next) => pos = next,
            None => break,
        }
    }
    changed
}

fn restamp_all(fuzz: &Path, old: u16) {
    for dir in ["corpus/frame", "corpus/server", "crashes/frame", "crashes/server"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir)) else { continue };
        for path in entries.map(|e| e.unwrap().path()) {
            let mut bytes = std::fs::read(&path).unwrap();
            if restamp(&mut bytes, old) {
                std::fs::write(&path, bytes).unwrap();
                println!("restamped {}", path.display());
            }
        }
    }
}

fn main() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR"));
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--restamp") {
        let old = args.get(i + 1).and_then(|v| v.parse::<u16>().ok()).expect("--restamp OLD: the protocol version to replace");
        restamp_all(fuzz, old);
    }
    let root = fuzz.join("corpus");
    for t in ["frame", "server", "codec"] {
        std::fs::create_dir_all(root.join(t)).unwrap();
    }
    let sgd = Optimizer::sgd().with_learning_rate(0.1).with_lr_mult("a", 0.5).with_clip_gradient(1.0);

    // frame: one frame per file, every section in use somewhere.
    let dir = root.join("frame");
    let mut push = data(Command::Push, Flags::REQUEST, &[(1, &[1.0, 2.0, 3.0, 4.0]), (3, &[0.5, 0.25])]);
    push.meta.offsets = vec![0, 4];
    push.meta.rounds = vec![0, 7];
    write(&dir, "push", &frames(&[push]));
    write(&dir, "pull", &frames(&[pull(&[(1, 4, 0)])]));
    write(&dir, "row-sparse-push", &frames(&[rows(Command::Push, 2, &[0, 2], &[1.0, 2.0, 3.0, 4.0])]));
    write(&dir, "row-sparse-pull", &frames(&[rows(Command::Pull, 2, &[1], &[])]));
    let mut init = data(Command::Push, Flags::INIT.with(Flags::REQUEST), &[(10, &[1.0; 3])]);
    init.meta.text = r#"["weight"]"#.into();
    write(&dir, "init", &frames(&[init]));
    write(&dir, "compressed-push", &frames(&[compressed(1, &[0.7, -0.6, 0.1, 0.0])]));
    write(&dir, "server-command", &frames(&[command(ServerCmd::SetOptimizer, adam().to_json().as_bytes(), "")]));
    let me = Node { role: Role::Worker, id: NodeId(9), rank: Some(0), host: "127.0.0.1".into(), port: 9091, task_id: Some(3) };
    write(&dir, "register", &frames(&[Message::register(Node::unassigned(Role::Server, "host-a", 9000, None))]));
    let everyone = vec![
        Node { role: Role::Scheduler, id: NodeId::SCHEDULER, rank: None, host: "sched".into(), port: 9000, task_id: None },
        me.clone(),
    ];
    write(&dir, "node-list", &frames(&[Message::node_list(everyone, NodeId(9))]));
    write(&dir, "node-dead", &frames(&[Message::node_dead(me, "heartbeat timeout")]));
    write(&dir, "barrier", &frames(&[Message::barrier(Group::SERVERS_AND_WORKERS, 5)]));
    write(&dir, "error", &frames(&[Message::coded_error(4, ErrorCode::ShapeMismatch, "key 1: shape (4,) cannot change to (3,)")]));
    write(&dir, "hello", &frames(&[Message::hello(Role::Worker, &[7; 48])]));
    let mut f16 = Message::new(Command::PushPull).with_flags(Flags::REQUEST);
    f16.meta.push_key(4, 6, 0);
    f16.chunks.push(Chunk { dtype: DTypeCode::F16, data: Bytes::from_static(&[0, 60, 0, 64, 0, 66]) });
    write(&dir, "pushpull-f16", &frames(&[f16]));

    // server: request sequences for `synkv::ps::server::fuzz::handle_frames` (keys 1: 4 × f32
    // "a"; 2: row_sparse 3 × 2; 3: parts at offsets 0 and 4). Frames alternate between
    // workers 0 and 1.
    let dir = root.join("server");
    let key1 = |v: f32| data(Command::Push, Flags::REQUEST, &[(1, &[v; 4])]);
    let pushpull1 = data(Command::PushPull, Flags::REQUEST, &[(1, &[1.0; 4])]);
    write(&dir, "sync-round", &frames(&[key1(1.0), key1(2.0), pull(&[(1, 4, 0)]), pushpull1.clone(), pushpull1]));
    write(
        &dir,
        "optimizer",
        &frames(&[
            command(ServerCmd::SetOptimizer, adam().to_json().as_bytes(), ""),
            key1(1.0),
            key1(2.0),
            command(ServerCmd::GetOptimizerStates, b"", ""),
            command(ServerCmd::GetOptimizerStates, br#"{"after":"a"}"#, ""),
            command(ServerCmd::Stats, b"", ""),
        ]),
    );
    write(
        &dir,
        "row-sparse",
        &frames(&[
            command(ServerCmd::SyncMode, b"async", ""),
            rows(Command::Push, 2, &[0, 2], &[1.0, 2.0, 3.0, 4.0]),
            rows(Command::Pull, 2, &[1, 2], &[]),
            rows(Command::PushPull, 2, &[1], &[5.0, 6.0]),
        ]),
    );
    write(&dir, "compressed", &frames(&[compressed(1, &[0.7, -0.6, 0.1, 0.0]), compressed(1, &[-0.9, 0.6, 0.5, 0.0]), pull(&[(1, 4, 0)])]));
    let mut part0 = data(Command::Push, Flags::REQUEST, &[(3, &[1.0; 4])]);
    part0.meta.rounds = vec![0];
    let mut part1 = data(Command::Push, Flags::REQUEST, &[(3, &[1.0; 2])]);
    part1.meta.offsets = vec![4];
    part1.meta.rounds = vec![0];
    write(&dir, "key-parts", &frames(&[part0.clone(), part0, part1.clone(), part1, pull(&[(3, 4, 0), (3, 2, 4)])]));
    let mut init = Message::new(Command::Push).with_flags(Flags::INIT.with(Flags::REQUEST));
    init.meta.push_key(10, 6, 0);
    init.chunks.push(Chunk { dtype: DTypeCode::F16, data: Bytes::from_static(&[0, 60, 0, 64, 0, 66]) });
    init.meta.text = r#"["half"]"#.into();
    let mut half_push = init.clone().with_flags(Flags::REQUEST);
    half_push.meta.text.clear();
    write(&dir, "init-f16", &frames(&[init, half_push.clone(), half_push, pull(&[(10, 1, 0)])]));
    write(
        &dir,
        "set-states",
        &frames(&[
            command(ServerCmd::SetOptimizer, sgd.to_json().as_bytes(), ""),
            command(ServerCmd::SetOptimizerStates, &states(sgd.clone(), "a", 4, false), "replace"),
            key1(1.0),
            key1(1.0),
            command(ServerCmd::GetOptimizerStates, b"", ""),
        ]),
    );

    // codec: byte 0 picks the operation (see `synkv_fuzz::codec`).
    let dir = root.join("codec");
    let floats = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let cat = |head: &[u8], tail: &[u8]| [head, tail].concat();
    write(&dir, "to-buffer-f32", &cat(&[0, 0, 0, 1], &floats(&[1.0, -2.5, 3.25, 1e-3])));
    write(&dir, "to-buffer-f16-as-f64", &cat(&[0, 2, 1, 0], &[0, 60, 0, 64, 0, 66, 0, 0xbc]));
    write(&dir, "row-ids", &cat(&[1, 6, 0, 10, 0], &codec::ids_to_chunk(&[0, 3, 7]).data));
    write(&dir, "copy-f32", &cat(&[2, 0, 0, 0, 3, 8, 2, 4], &floats(&[1.0, 2.0, 3.0, 4.0])));
    write(&dir, "add-bf16-into-f32", &cat(&[2, 1, 12, 0, 0, 4, 0, 4], &[0x80, 0x3f, 0, 0x40, 0x40, 0x40, 0x80, 0x40]));
    let mut sum = vec![3, 0, 4, 2, 0, 0, 4];
    sum.extend(floats(&[1.0; 4]));
    sum.extend([2, 1, 4, 0, 60, 0, 60, 0, 60, 0, 60]);
    write(&dir, "sum", &sum);
    let half_t = 0.5f32.to_le_bytes();
    let grad = [0.7, -0.6, 0.1, 0.0, 0.55, -0.8, 0.2, 0.3, -0.1, 0.9, 0.0, -0.5, 0.6, 0.1, -0.7, 0.8, 0.51, -0.51, 0.0, 0.0];
    let gc = GradientCompression::new(CompressionType::TwoBit, 0.5).unwrap();
    let mut words = vec![0u32; gc.compressed_len(grad.len())];
    gc.quantize(&grad, &mut vec![0.0; grad.len()], &mut words).unwrap();
    let mut deq = vec![4, 0];
    deq.extend(half_t);
    deq.extend([20, 0, 3]);
    deq.extend(synkv::compression::words_to_bytes(&words));
    write(&dir, "dequantize-2bit", &deq);
    let mut deq1 = deq.clone();
    deq1[1] = 1;
    write(&dir, "dequantize-1bit", &deq1);
    let mut q = vec![5, 0];
    q.extend(half_t);
    q.push(3);
    q.extend(floats(&grad));
    write(&dir, "quantize-2bit", &q);
    write(&dir, "states-adam", &cat(&[6, 0, 2], &states(adam(), "w", 4, false)));
    write(&dir, "states-adam-f16-master", &cat(&[6, 0, 2], &states(adam().with_multi_precision(true), "w", 3, true)));
    write(
        &dir,
        "states-sgd-momentum",
        &cat(&[6, 2, 2], &states(Optimizer::from(synkv::optimizer::Sgd { momentum: 0.9, ..Default::default() }), "k@4", 2, false)),
    );
    write(&dir, "optimizer-json", &cat(&[7], adam().with_lr_scheduler(LrScheduler::factor(10, 0.9)).to_json().as_bytes()));
    write(&dir, "optimizer-json-sgd", &cat(&[7], sgd.to_json().as_bytes()));
    write(&dir, "compression-json", &cat(&[7], br#"{"type":"2bit","threshold":0.5}"#));
    write(&dir, "compression-wire", &cat(&[7], b"1,0.25"));
}

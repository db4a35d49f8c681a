//! Unit tests of the server core, driven event by event without sockets: init, sync rounds
//! counting distinct workers (K12.10), pushpull replies, async apply, commands.

use tokio::sync::mpsc;

use super::core::{Core, Event};
use super::ServerCmd;
use crate::ndarray::Buffer;
use crate::optimizer::{Optimizer, Sgd};
use crate::ps::codec;
use crate::ps::node::NodeId;
use crate::ps::proto::{Command, Flags, Message};

struct Harness {
    core: Core,
    tx: mpsc::UnboundedSender<Message>,
    rx: mpsc::UnboundedReceiver<Message>,
    next: u64,
}

fn harness(workers: u32) -> Harness {
    let (tx, rx) = mpsc::unbounded_channel();
    Harness { core: Core::new(NodeId(8), workers), tx, rx, next: 1 }
}

fn data(command: Command, flags: Flags, keys: &[(u64, Vec<f32>)]) -> Message {
    let mut m = Message::new(command).with_flags(flags);
    for (k, v) in keys {
        let chunk = codec::range_to_chunk(&Buffer::from_vec(v.clone()), 0, v.len());
        m.meta.keys.push(*k);
        m.meta.lens.push(chunk.data.len() as u64);
        m.chunks.push(chunk);
    }
    m
}

fn values(m: &Message) -> Vec<Vec<f32>> {
    m.chunks.iter().map(|c| codec::chunk_to_buffer(c, crate::DType::F32).unwrap().to_vec::<f32>()).collect()
}

impl Harness {
    /// Sends `msg` from worker `worker` on connection `worker` and returns its request id.
    fn send(&mut self, worker: u32, msg: Message) -> u64 {
        let id = self.next;
        self.next += 1;
        let msg = msg.with_request_id(id).with_sender(NodeId::worker(worker).unwrap());
        self.core.on_event(Event::Request { conn: u64::from(worker), worker, msg, reply: self.tx.clone() });
        id
    }

    fn replies(&mut self) -> Vec<Message> {
        let mut out = Vec::new();
        while let Ok(m) = self.rx.try_recv() {
            out.push(m);
        }
        out
    }

    fn init(&mut self, keys: &[(u64, Vec<f32>)]) {
        self.send(0, data(Command::Push, Flags::INIT, keys));
        let r = self.replies();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].command, Command::Reply, "{}", r[0].meta.text);
    }

    fn pull(&mut self, key: u64, len: u64) -> Vec<f32> {
        let mut m = Message::new(Command::Pull);
        m.meta.keys.push(key);
        m.meta.lens.push(len * 4);
        self.send(0, m);
        let r = self.replies();
        assert_eq!(r[0].command, Command::Reply, "{}", r[0].meta.text);
        values(&r[0]).remove(0)
    }
}

#[test]
fn a_second_init_of_a_key_is_an_error_naming_it() {
    let mut h = harness(1);
    let mut m = data(Command::Push, Flags::INIT, &[(3, vec![1.0; 2])]);
    m.meta.text = r#"["weight"]"#.into();
    h.send(0, m.clone());
    assert_eq!(h.replies()[0].command, Command::Reply);
    h.send(0, m);
    let r = h.replies();
    assert_eq!(r[0].command, Command::Error);
    assert!(r[0].meta.text.contains("duplicate init of key weight"), "{}", r[0].meta.text);
}

#[test]
fn a_round_counts_distinct_workers_and_queues_a_second_push() {
    let mut h = harness(2);
    h.init(&[(5, vec![0.0; 3])]);
    // Worker 0 pushes twice before worker 1 pushes once: the second push waits.
    let a = h.send(0, data(Command::Push, Flags::NONE, &[(5, vec![1.0; 3])]));
    let b = h.send(0, data(Command::Push, Flags::NONE, &[(5, vec![10.0; 3])]));
    assert!(h.replies().is_empty(), "no reply before every worker pushed");
    assert_eq!(h.pull(5, 3), vec![0.0; 3], "pulls are answered at once with the current value");
    let c = h.send(1, data(Command::Push, Flags::NONE, &[(5, vec![2.0; 3])]));
    let ids: Vec<u64> = h.replies().iter().map(|m| m.request_id).collect();
    assert_eq!(ids, vec![a, c], "round 1 = worker 0's first push + worker 1's");
    assert_eq!(h.pull(5, 3), vec![3.0; 3], "assign: the sum of the round");
    let d = h.send(1, data(Command::Push, Flags::NONE, &[(5, vec![20.0; 3])]));
    let ids: Vec<u64> = h.replies().iter().map(|m| m.request_id).collect();
    assert_eq!(ids, vec![b, d]);
    assert_eq!(h.pull(5, 3), vec![30.0; 3]);
}

#[test]
fn pushpull_replies_carry_the_updated_value_and_multi_key_requests_wait_for_every_key() {
    let mut h = harness(2);
    h.init(&[(1, vec![0.0; 2]), (2, vec![0.0; 1])]);
    h.send(0, data(Command::PushPull, Flags::NONE, &[(1, vec![1.0; 2]), (2, vec![1.0])]));
    h.send(1, data(Command::PushPull, Flags::NONE, &[(1, vec![2.0; 2])]));
    let r = h.replies();
    assert_eq!(r.len(), 1, "worker 1's single-key request is done, worker 0's waits for key 2");
    assert_eq!(values(&r[0]), vec![vec![3.0, 3.0]]);
    h.send(1, data(Command::PushPull, Flags::NONE, &[(2, vec![5.0])]));
    let r = h.replies();
    assert_eq!(r.len(), 2);
    assert_eq!(values(&r[0]), vec![vec![3.0, 3.0], vec![6.0]]);
    assert_eq!(r[0].meta.keys, vec![1, 2]);
}

#[test]
fn uninitialised_keys_and_wrong_sizes_are_refused_without_changing_anything() {
    let mut h = harness(1);
    h.init(&[(7, vec![1.0; 4])]);
    h.send(0, data(Command::Push, Flags::NONE, &[(7, vec![1.0; 4]), (8, vec![1.0])]));
    let r = h.replies();
    assert_eq!(r[0].command, Command::Error);
    assert!(r[0].meta.text.contains("key 8 has not been initialised"), "{}", r[0].meta.text);
    h.send(0, data(Command::Push, Flags::NONE, &[(7, vec![1.0; 3])]));
    assert!(h.replies()[0].meta.text.contains("cannot change"));
    assert_eq!(h.pull(7, 4), vec![1.0; 4], "the refused pushes changed nothing");
}

#[test]
fn async_mode_applies_each_push_and_assigns_without_an_optimizer() {
    let mut h = harness(2);
    h.send(0, Message::server_command(ServerCmd::SyncMode.id(), "async".into()));
    assert_eq!(h.replies()[0].command, Command::Reply);
    h.init(&[(1, vec![0.0; 2])]);
    h.send(0, data(Command::Push, Flags::NONE, &[(1, vec![4.0; 2])]));
    assert_eq!(h.replies().len(), 1, "answered at once");
    assert_eq!(h.pull(1, 2), vec![4.0; 2]);
}

#[test]
fn the_same_optimizer_keeps_its_states_and_another_replaces_them() {
    let mut h = harness(1);
    let sgd = Optimizer::from(Sgd { momentum: 0.5, ..Sgd::default() }).with_learning_rate(1.0);
    let set = |h: &mut Harness, o: &Optimizer| {
        h.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), o.to_json().into()));
        assert_eq!(h.replies()[0].command, Command::Reply);
    };
    set(&mut h, &sgd);
    h.init(&[(1, vec![0.0])]);
    h.send(0, data(Command::Push, Flags::NONE, &[(1, vec![1.0])]));
    h.replies();
    assert_eq!(h.pull(1, 1), vec![-1.0]);
    set(&mut h, &sgd); // identical: momentum survives
    h.send(0, data(Command::Push, Flags::NONE, &[(1, vec![1.0])]));
    h.replies();
    assert_eq!(h.pull(1, 1), vec![-2.5], "m = 0.5·(−1) − 1; w = −1 + m");
    set(&mut h, &sgd.clone().with_learning_rate(2.0)); // different: states start over
    h.send(0, data(Command::Push, Flags::NONE, &[(1, vec![1.0])]));
    h.replies();
    assert_eq!(h.pull(1, 1), vec![-4.5]);
    h.send(0, Message::server_command(ServerCmd::GetOptimizerStates.id(), bytes::Bytes::new()));
    let r = h.replies();
    assert!(!r[0].chunks[0].data.is_empty());
    h.send(0, Message::server_command(42, bytes::Bytes::new()));
    assert!(h.replies()[0].meta.text.contains("unknown server command id 42"));
}

/// A compressed push of `grads` (quantized here with fresh residuals) for key `k`.
fn packed(command: Command, gc: &crate::compression::GradientCompression, keys: &[(u64, Vec<f32>)]) -> Message {
    let mut m = Message::new(command).with_flags(Flags::COMPRESSED);
    m.meta.text = serde_json::to_string(gc).unwrap();
    for (k, g) in keys {
        let mut residual = vec![0.0f32; g.len()];
        let mut words = vec![0u32; gc.compressed_len(g.len())];
        gc.quantize(g, &mut residual, &mut words).unwrap();
        let chunk = crate::ps::proto::Chunk { dtype: crate::ps::proto::DTypeCode::U32, data: codec::words_into_bytes(words.into()) };
        m.meta.keys.push(*k);
        m.meta.lens.push(chunk.data.len() as u64);
        m.chunks.push(chunk);
    }
    m
}

#[test]
fn compressed_pushes_are_dequantized_and_summed_even_mixed_with_plain_ones() {
    use crate::compression::{CompressionType, GradientCompression};
    let gc = GradientCompression::new(CompressionType::TwoBit, 0.5).unwrap();
    let mut h = harness(2);
    h.init(&[(4, vec![1.0; 8])]);
    // K7.6's vector from both workers: each dequantizes to [0.5,-0.5,0,0.5,-0.5,0,0.5,0].
    let grad = vec![0.6f32, -0.7, 0.2, 0.5, -0.5, 0.0, 1.2, -0.49];
    h.send(0, packed(Command::Push, &gc, &[(4, grad.clone())]));
    h.send(1, packed(Command::PushPull, &gc, &[(4, grad.clone())]));
    let r = h.replies();
    assert_eq!(r.len(), 2, "{:?}", r.iter().map(|m| &m.meta.text).collect::<Vec<_>>());
    assert_eq!(values(&r[1]), vec![vec![1.0, -1.0, 0.0, 1.0, -1.0, 0.0, 1.0, 0.0]], "assign: the sum of the dequantized pushes");
    // One compressed push and one plain push in one round.
    h.send(0, packed(Command::Push, &gc, &[(4, grad)]));
    h.send(1, data(Command::Push, Flags::NONE, &[(4, vec![10.0; 8])]));
    assert_eq!(h.replies().len(), 2);
    assert_eq!(h.pull(4, 8), vec![10.5, 9.5, 10.0, 10.5, 9.5, 10.0, 10.5, 10.0]);
}

#[test]
fn compressed_pushes_feed_the_optimizer_and_async_mode() {
    use crate::compression::{CompressionType, GradientCompression};
    let gc = GradientCompression::new(CompressionType::OneBit, 0.0).unwrap();
    let mut h = harness(1);
    h.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), Optimizer::test().with_rescale_grad(2.0).to_json().into()));
    assert_eq!(h.replies()[0].command, Command::Reply);
    h.init(&[(1, vec![1.0; 3])]);
    h.send(0, packed(Command::Push, &gc, &[(1, vec![0.3, -2.0, 0.0])]));
    assert_eq!(h.replies()[0].command, Command::Reply);
    // 1-bit: +1 for > threshold, -1 otherwise; w += 2·g.
    assert_eq!(h.pull(1, 3), vec![3.0, -1.0, -1.0]);
    h.send(0, Message::server_command(ServerCmd::SyncMode.id(), "async".into()));
    h.replies();
    h.send(0, packed(Command::Push, &gc, &[(1, vec![1.0; 3])]));
    assert_eq!(h.replies().len(), 1, "answered at once");
    assert_eq!(h.pull(1, 3), vec![5.0, 1.0, 1.0]);
}

#[test]
fn malformed_compressed_pushes_are_refused_without_changing_anything() {
    use crate::compression::{CompressionType, GradientCompression};
    let gc = GradientCompression::new(CompressionType::TwoBit, 0.5).unwrap();
    let mut h = harness(1);
    h.init(&[(1, vec![1.0; 40])]);
    let mut wrong_len = packed(Command::Push, &gc, &[(1, vec![1.0; 40])]);
    wrong_len.chunks[0].data = wrong_len.chunks[0].data.slice(..8);
    wrong_len.meta.lens[0] = 8;
    h.send(0, wrong_len);
    let text = h.replies().remove(0).meta.text;
    assert!(text.contains("need 3 packed 2bit words"), "{text}");
    let mut no_config = packed(Command::Push, &gc, &[(1, vec![1.0; 40])]);
    no_config.meta.text = r#"{"type":"3bit"}"#.into();
    h.send(0, no_config);
    let text = h.replies().remove(0).meta.text;
    assert!(text.contains("configuration"), "{text}");
    let init_packed = packed(Command::Push, &gc, &[(2, vec![1.0; 4])]).with_flags(Flags::COMPRESSED.with(Flags::INIT));
    h.send(0, init_packed);
    assert!(h.replies().remove(0).meta.text.contains("uncompressed"));
    assert_eq!(h.pull(1, 40), vec![1.0; 40], "nothing changed");
}

#[test]
fn pulls_share_the_value_and_a_held_reply_never_sees_a_later_update() {
    let mut h = harness(1);
    h.init(&[(1, vec![1.0; 4])]);
    let pull = |h: &mut Harness| {
        let mut m = Message::new(Command::Pull);
        m.meta.keys.push(1);
        m.meta.lens.push(16);
        h.send(0, m);
        h.replies().remove(0)
    };
    let held = pull(&mut h);
    let first_ptr = held.chunks[0].data.as_ptr();
    h.send(0, data(Command::Push, Flags::NONE, &[(1, vec![2.0; 4])]));
    h.replies();
    assert_eq!(values(&held), vec![vec![1.0; 4]], "the reply still carries the value it was sent with");
    let second = pull(&mut h);
    assert_eq!(values(&second), vec![vec![2.0; 4]]);
    assert_ne!(second.chunks[0].data.as_ptr(), first_ptr, "updated in another buffer while a reply held the value");
    let second_ptr = second.chunks[0].data.as_ptr();
    drop((held, second));
    h.send(0, data(Command::Push, Flags::NONE, &[(1, vec![3.0; 4])]));
    h.replies();
    let third = pull(&mut h);
    assert_eq!(values(&third), vec![vec![3.0; 4]]);
    assert_eq!(third.chunks[0].data.as_ptr(), second_ptr, "no reply held it: updated in place, no copy");
}

#[test]
fn an_optimizer_step_on_a_value_held_by_a_reply_starts_from_that_value() {
    let mut h = harness(1);
    h.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), Optimizer::test().with_rescale_grad(1.0).to_json().into()));
    h.replies();
    h.init(&[(1, vec![1.0; 4])]);
    let pull = |h: &mut Harness| {
        let mut m = Message::new(Command::Pull);
        m.meta.keys.push(1);
        m.meta.lens.push(16);
        h.send(0, m);
        h.replies().remove(0)
    };
    let push = |h: &mut Harness| {
        h.send(0, data(Command::Push, Flags::NONE, &[(1, vec![2.0; 4])]));
        assert_eq!(h.replies()[0].command, Command::Reply);
    };
    let first = pull(&mut h);
    let first_ptr = first.chunks[0].data.as_ptr();
    push(&mut h); // a new buffer, copied from the held value; the held one becomes the spare
    drop(first);
    let second = pull(&mut h);
    push(&mut h); // held again: the spare (free now) gets a copy of the value, then the step
    assert_eq!(values(&second), vec![vec![3.0; 4]], "a held reply keeps its value");
    let third = pull(&mut h);
    assert_eq!(third.chunks[0].data.as_ptr(), first_ptr, "the spare's allocation was reused");
    assert_eq!(values(&third), vec![vec![5.0; 4]]);
    drop((second, third));
    push(&mut h);
    assert_eq!(h.pull(1, 4), vec![7.0; 4], "w += g three times from 1");
}

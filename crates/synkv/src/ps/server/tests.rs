//! Unit tests of the server core, driven event by event without sockets: init, sync rounds
//! counting distinct workers (K12.10), pushpull replies, async apply, commands.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::core::{Core, Event, Settings};
use super::ServerCmd;
use crate::ndarray::Buffer;
use crate::optimizer::{Optimizer, Sgd};
use crate::ps::codec;
use crate::ps::node::NodeId;
use crate::ps::proto::{Command, ErrorCode, Flags, Message};
use crate::ps::transport::{Admission, Outbox, OutboxRx};

struct Harness {
    core: Core,
    /// One outbox shared by every connection, so replies keep their global order.
    rx: OutboxRx,
    next: u64,
}

fn settings(workers: u32) -> Settings {
    Settings {
        rank: 0,
        num_servers: 1,
        num_workers: workers,
        held_budget: 1 << 30,
        straggler_warn: Duration::from_secs(60),
        page_bytes: 1 << 20,
        replicas: false,
        shared: None,
        threads: super::core::UpdateThreads::Cores,
    }
}

fn harness(workers: u32) -> Harness {
    harness_with(settings(workers))
}

fn harness_with(settings: Settings) -> Harness {
    let (outbox, rx) = Outbox::bounded(1 << 16, 1 << 30);
    let mut core = Core::new(NodeId(8), settings.clone());
    for w in 0..settings.num_workers {
        core.on_event(Event::Opened { conn: u64::from(w), outbox: outbox.clone(), close: CancellationToken::new() });
    }
    Harness { core, rx, next: 1 }
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

/// A pull of `len` floats of `key`.
fn pull_of(key: u64, len: u64) -> Message {
    let mut m = Message::new(Command::Pull);
    m.meta.keys.push(key);
    m.meta.lens.push(len * 4);
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
        self.core.on_event(Event::Request { conn: u64::from(worker), worker, msg, admission: Admission::default() });
        id
    }

    fn replies(&mut self) -> Vec<Message> {
        std::iter::from_fn(|| self.rx.try_recv()).collect()
    }

    fn init(&mut self, keys: &[(u64, Vec<f32>)]) {
        self.send(0, data(Command::Push, Flags::INIT, keys));
        let r = self.replies();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].command, Command::Reply, "{}", r[0].meta.text);
    }

    fn pull(&mut self, key: u64, len: u64) -> Vec<f32> {
        self.send(0, pull_of(key, len));
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

/// An answer carries its request's priority (the connection's writer orders answers by it),
/// whether it is sent at once (a pull) or when a round completes (a pushpull).
#[test]
fn answers_carry_their_requests_priority() {
    let mut h = harness(1);
    h.init(&[(1, vec![0.0; 2])]);
    let mut m = data(Command::PushPull, Flags::NONE, &[(1, vec![1.0; 2])]);
    m.meta.priority = 7;
    h.send(0, m);
    let mut p = pull_of(1, 2);
    p.meta.priority = -3;
    h.send(0, p);
    let r = h.replies();
    assert_eq!(r.iter().map(|m| m.meta.priority).collect::<Vec<_>>(), vec![7, -3]);
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
    assert_eq!(r[0].meta.text, r#"{"next":null}"#, "one page holds the only state");
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

/// A push of `keys` with round ids.
fn rounds(mut m: Message, ids: &[u64]) -> Message {
    m.meta.rounds = ids.to_vec();
    m
}

#[test]
fn a_duplicated_push_is_refused_by_its_round_id_and_never_applied_twice() {
    let mut h = harness(2);
    h.init(&[(5, vec![0.0; 2])]);
    let push = |v: f32, r: u64| rounds(data(Command::Push, Flags::NONE, &[(5, vec![v; 2])]), &[r]);
    h.send(0, push(1.0, 0));
    let dup = h.send(0, push(1.0, 0)); // a retry of the same push
    let r = h.replies();
    assert_eq!((r[0].request_id, r[0].command, r[0].error_code()), (dup, Command::Error, ErrorCode::DuplicatePush), "{}", r[0].meta.text);
    assert!(r[0].meta.text.contains("not applied twice"), "{}", r[0].meta.text);
    assert_eq!(r[0].meta.keys, vec![5], "the error names the key");
    h.send(1, push(2.0, 0));
    assert_eq!(h.replies().len(), 2, "round 0 completes with one push per worker: both are answered");
    assert_eq!(h.pull(5, 2), vec![3.0; 2], "1 + 2: worker 0's push counted once");
    // A push from a completed round, and one that skips a round, change nothing.
    h.send(1, push(100.0, 0));
    assert_eq!(h.replies()[0].error_code(), ErrorCode::DuplicatePush);
    h.send(1, push(100.0, 5));
    assert_eq!(h.replies()[0].error_code(), ErrorCode::RoundGap);
    assert_eq!(h.pull(5, 2), vec![3.0; 2]);
    // Round 1, with worker 1 first and worker 0's push after.
    h.send(1, push(10.0, 1));
    h.send(0, push(20.0, 1));
    assert_eq!(h.replies().len(), 2);
    assert_eq!(h.pull(5, 2), vec![30.0; 2]);
}

#[test]
fn async_round_ids_refuse_duplicates_too() {
    let mut h = harness(2);
    h.send(0, Message::server_command(ServerCmd::SyncMode.id(), "async".into()));
    h.replies();
    h.init(&[(1, vec![0.0; 2])]);
    h.send(0, rounds(data(Command::Push, Flags::NONE, &[(1, vec![4.0; 2])]), &[0]));
    h.send(0, rounds(data(Command::Push, Flags::NONE, &[(1, vec![9.0; 2])]), &[0]));
    let r = h.replies();
    assert_eq!((r[0].command, r[1].error_code()), (Command::Reply, ErrorCode::DuplicatePush));
    assert_eq!(h.pull(1, 2), vec![4.0; 2]);
}

#[test]
fn finished_workers_no_longer_hold_sync_rounds() {
    let mut h = harness(3);
    h.init(&[(1, vec![0.0; 2])]);
    h.send(0, data(Command::Push, Flags::NONE, &[(1, vec![1.0; 2])]));
    h.send(1, data(Command::Push, Flags::NONE, &[(1, vec![2.0; 2])]));
    assert!(h.replies().is_empty(), "waits for worker 2");
    // Worker 2 finished (an uneven last epoch): the round completes without it.
    h.core.on_event(Event::WorkersDone(crate::ps::cluster::Absent::new([2], 1)));
    assert_eq!(h.replies().len(), 2);
    assert_eq!(h.pull(1, 2), vec![3.0; 2]);
    h.send(0, data(Command::Push, Flags::NONE, &[(1, vec![5.0; 2])]));
    h.send(1, data(Command::Push, Flags::NONE, &[(1, vec![5.0; 2])]));
    assert_eq!(h.replies().len(), 2, "later rounds need the two workers left");
    assert_eq!(h.pull(1, 2), vec![10.0; 2]);
}

#[test]
fn past_the_held_budget_pushes_are_folded_on_arrival_with_the_same_result() {
    let n = 1000;
    for budget in [0usize, 3 * n * 4, 1 << 30] {
        for optimizer in [false, true] {
            let mut h = harness_with(Settings { held_budget: budget, ..settings(6) });
            if optimizer {
                h.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), Optimizer::test().with_rescale_grad(0.5).to_json().into()));
                h.replies();
            }
            h.init(&[(1, vec![1.0; n]), (2, vec![0.0; 3])]);
            let mut peak = 0;
            for w in 0..6u32 {
                let v = (w + 1) as f32;
                h.send(w, data(Command::Push, Flags::NONE, &[(1, vec![v; n]), (2, vec![v; 3])]));
                peak = peak.max(h.core.held_bytes());
            }
            assert_eq!(h.replies().len(), 6);
            let sum = 21.0f32;
            let want = if optimizer { 1.0 + 0.5 * sum } else { sum };
            assert_eq!(h.pull(1, n as u64), vec![want; n], "budget {budget}, optimizer {optimizer}");
            assert!(peak <= budget.max(n * 4 + 12), "held {peak} bytes with a budget of {budget}");
            assert_eq!(h.core.held_bytes(), 0, "nothing held once the round completed");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_round_waiting_past_the_straggler_bound_is_reported_to_its_waiters_at_a_bounded_rate() {
    let mut h = harness_with(Settings { straggler_warn: Duration::from_secs(2), ..settings(3) });
    h.init(&[(7, vec![0.0; 2])]);
    h.send(0, data(Command::Push, Flags::NONE, &[(7, vec![1.0; 2])]));
    h.send(1, data(Command::Push, Flags::NONE, &[(7, vec![1.0; 2])]));
    h.core.on_event(Event::Tick);
    assert!(h.replies().is_empty(), "not late yet");
    tokio::time::advance(Duration::from_millis(2100)).await;
    h.core.on_event(Event::Tick);
    let notices = h.replies();
    assert_eq!(notices.len(), 2, "one notice per waiting connection");
    assert!(notices.iter().all(|m| m.command == Command::Notice));
    assert!(notices[0].meta.text.contains("waited 2 s for worker rank 2"), "{}", notices[0].meta.text);
    tokio::time::advance(Duration::from_millis(500)).await;
    h.core.on_event(Event::Tick);
    assert!(h.replies().is_empty(), "at most one report per bound");
    tokio::time::advance(Duration::from_millis(2000)).await;
    h.core.on_event(Event::Tick);
    assert_eq!(h.replies().len(), 2, "repeated after another bound");
    h.send(2, data(Command::Push, Flags::NONE, &[(7, vec![1.0; 2])]));
    assert_eq!(h.replies().len(), 3, "slow is not dead: the round completes");
    assert_eq!(h.pull(7, 2), vec![3.0; 2]);
}

#[test]
fn refusals_carry_their_error_code() {
    let mut h = harness(1);
    h.init(&[(1, vec![0.0; 2])]);
    let code = |h: &mut Harness, m: Message| {
        h.send(0, m);
        let r = h.replies().remove(0);
        assert_eq!(r.command, Command::Error);
        r.error_code()
    };
    assert_eq!(code(&mut h, data(Command::Push, Flags::NONE, &[(9, vec![1.0])])), ErrorCode::NotInitialized);
    assert_eq!(code(&mut h, data(Command::Push, Flags::INIT, &[(1, vec![1.0])])), ErrorCode::DuplicateInit);
    assert_eq!(code(&mut h, data(Command::Push, Flags::NONE, &[(1, vec![1.0; 3])])), ErrorCode::ShapeMismatch);
    let mut f64_push = Message::new(Command::Push);
    let chunk = codec::range_to_chunk(&Buffer::from_vec(vec![1.0f64; 2]), 0, 2);
    f64_push.meta.keys.push(1);
    f64_push.meta.lens.push(16);
    f64_push.chunks.push(chunk);
    assert_eq!(code(&mut h, f64_push), ErrorCode::DTypeMismatch);
    let mut rows = Message::new(Command::Pull).with_flags(Flags::ROW_SPARSE);
    rows.meta.keys.push(1);
    rows.meta.lens.push(8);
    rows.chunks.push(codec::ids_to_chunk(&[0]));
    assert_eq!(code(&mut h, rows), ErrorCode::StorageMismatch);
    assert_eq!(code(&mut h, Message::server_command(ServerCmd::GetOptimizerStates.id(), bytes::Bytes::new())), ErrorCode::NoOptimizer);
    assert_eq!(h.pull(1, 2), vec![0.0; 2]);
}

#[test]
fn parts_of_one_key_are_entries_with_their_own_rounds_and_optimizer_states() {
    let mut h = harness(1);
    let sgd = Optimizer::from(Sgd { momentum: 0.5, ..Sgd::default() }).with_learning_rate(1.0);
    h.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), sgd.to_json().into()));
    h.replies();
    let mut init = data(Command::Push, Flags::INIT, &[(3, vec![0.0; 4]), (3, vec![10.0; 2])]);
    init.meta.offsets = vec![0, 4];
    init.meta.text = r#"["w","w"]"#.into();
    h.send(0, init);
    assert_eq!(h.replies()[0].command, Command::Reply);
    // Each part is pushed in its own message, as a worker cuts a big key.
    for (offset, len) in [(0u64, 4usize), (4, 2)] {
        let mut m = data(Command::Push, Flags::NONE, &[(3, vec![1.0; len])]);
        m.meta.offsets = vec![offset];
        m.meta.rounds = vec![0];
        h.send(0, m);
        assert_eq!(h.replies()[0].command, Command::Reply);
    }
    let mut pull = Message::new(Command::Pull);
    pull.meta.keys = vec![3, 3];
    pull.meta.lens = vec![16, 8];
    pull.meta.offsets = vec![0, 4];
    h.send(0, pull);
    let r = h.replies().remove(0);
    assert_eq!(r.meta.offsets, vec![0, 4], "a reply names the parts it carries");
    assert_eq!(values(&r), vec![vec![-1.0; 4], vec![9.0; 2]]);
    h.send(0, Message::server_command(ServerCmd::GetOptimizerStates.id(), bytes::Bytes::new()));
    let page = h.replies().remove(0);
    let states = crate::optimizer::Updater::from_saved_states(&page.chunks[0].data).unwrap();
    let mut keys: Vec<&str> = states.state_keys().collect();
    keys.sort();
    assert_eq!(keys, vec!["w", "w@4"]);
    assert_eq!((states.update_count("w"), states.update_count("w@4")), (Some(1), Some(1)), "one update each, not two");
}

#[test]
fn optimizer_states_travel_in_pages_and_load_back() {
    let mut h = harness_with(Settings { page_bytes: 1000, ..settings(1) });
    let adam = Optimizer::from(crate::optimizer::Adam::default());
    h.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), adam.to_json().into()));
    h.replies();
    let keys: Vec<(u64, Vec<f32>)> = (0..20).map(|k| (k, vec![1.0; 50])).collect();
    h.init(&keys);
    h.send(0, data(Command::Push, Flags::NONE, &keys));
    h.replies();
    // Pages of at most ~1000 bytes: 20 states of 2 × 50 floats need many.
    let mut after: Option<String> = None;
    let mut pages = Vec::new();
    loop {
        let body = serde_json::json!({ "after": after }).to_string();
        h.send(0, Message::server_command(ServerCmd::GetOptimizerStates.id(), body.into()));
        let r = h.replies().remove(0);
        assert_eq!(r.command, Command::Reply, "{}", r.meta.text);
        let cursor: serde_json::Value = serde_json::from_str(&r.meta.text).unwrap();
        pages.push(r.chunks[0].data.clone());
        match cursor["next"].as_str() {
            Some(k) => after = Some(k.to_owned()),
            None => break,
        }
    }
    assert!(pages.len() >= 10, "{} pages", pages.len());
    let mut whole = crate::optimizer::Updater::try_new(adam.clone()).unwrap();
    for p in &pages {
        whole.merge_states(p, false).unwrap();
    }
    assert_eq!(whole.state_count(), 20);
    // Load them back page by page into a fresh server: the first page replaces.
    let mut fresh = harness_with(Settings { page_bytes: 1000, ..settings(1) });
    fresh.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), adam.to_json().into()));
    fresh.replies();
    for (i, p) in pages.iter().enumerate() {
        let mut m = Message::server_command(ServerCmd::SetOptimizerStates.id(), p.clone());
        m.meta.text = if i == 0 { "replace".into() } else { "merge".into() };
        fresh.send(0, m);
        assert_eq!(fresh.replies()[0].command, Command::Reply);
    }
    fresh.send(0, Message::server_command(ServerCmd::GetOptimizerStates.id(), serde_json::json!({ "after": null }).to_string().into()));
    let first = fresh.replies().remove(0);
    assert_eq!(first.chunks[0].data, pages[0], "the same first page, byte for byte");
}

#[test]
fn a_connection_whose_outbox_refuses_a_reply_is_closed() {
    let mut core = Core::new(NodeId(8), settings(1));
    let (outbox, _rx) = Outbox::bounded(4, 1 << 20);
    let close = CancellationToken::new();
    core.on_event(Event::Opened { conn: 0, outbox, close: close.clone() });
    let mut m = Message::new(Command::Pull);
    m.meta.keys.push(1);
    m.meta.lens.push(4);
    for id in 1..=5 {
        let msg = m.clone().with_request_id(id).with_sender(NodeId::worker(0).unwrap());
        core.on_event(Event::Request { conn: 0, worker: 0, msg, admission: Admission::default() });
    }
    assert!(close.is_cancelled(), "the fifth reply found the outbox full");
}

#[test]
fn stats_report_memory_and_key_parts() {
    let mut h = harness(1);
    h.init(&[(1, vec![0.0; 2]), (2, vec![0.0; 2])]);
    h.send(0, Message::server_command(ServerCmd::Stats.id(), bytes::Bytes::new()));
    let r = h.replies().remove(0);
    let stats: serde_json::Value = serde_json::from_slice(&r.chunks[0].data).unwrap();
    assert_eq!(stats["entries"], 2);
    if cfg!(target_os = "linux") {
        assert!(stats["peak_rss_bytes"].as_u64().unwrap() >= stats["rss_bytes"].as_u64().unwrap() / 2);
    }
}

#[test]
fn a_checkpoint_restores_values_optimizer_states_and_mode_and_init_claims_restored_keys() {
    let dir = std::env::temp_dir().join(format!("synkv-core-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut h = harness(1);
    let sgd = Optimizer::from(Sgd { momentum: 0.5, ..Sgd::default() }).with_learning_rate(1.0);
    h.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), sgd.to_json().into()));
    h.replies();
    let mut init = data(Command::Push, Flags::INIT, &[(1, vec![0.0; 3]), (2, vec![5.0; 2])]);
    init.meta.text = r#"["w","b"]"#.into();
    h.send(0, init.clone());
    h.replies();
    h.send(0, data(Command::Push, Flags::NONE, &[(1, vec![1.0; 3])]));
    h.replies();
    let body = serde_json::json!({ "dir": dir, "id": 3 }).to_string();
    h.send(0, Message::server_command(ServerCmd::Checkpoint.id(), body.into()));
    let r = h.replies().remove(0);
    assert_eq!(r.command, Command::Reply, "{}", r.meta.text);
    let file: crate::ps::checkpoint::ShardFile = serde_json::from_slice(&r.chunks[0].data).unwrap();
    // A later push is not in the checkpoint.
    h.send(0, data(Command::Push, Flags::NONE, &[(1, vec![100.0; 3])]));
    h.replies();

    let shard = crate::ps::checkpoint::read_shard(&dir.join(&file.file)).unwrap();
    let mut fresh = harness(1);
    assert_eq!(fresh.core.restore(shard).unwrap(), 2);
    assert_eq!(fresh.pull(1, 3), vec![-1.0; 3], "the checkpoint's value");
    fresh.send(0, init.clone());
    assert_eq!(fresh.replies()[0].command, Command::Reply, "init of restored keys is accepted");
    assert_eq!(fresh.pull(2, 2), vec![5.0; 2], "and keeps the checkpoint's value");
    fresh.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), sgd.to_json().into()));
    fresh.replies();
    fresh.send(0, data(Command::Push, Flags::NONE, &[(1, vec![1.0; 3])]));
    fresh.replies();
    assert_eq!(fresh.pull(1, 3), vec![-2.5; 3], "the momentum came back with the checkpoint: m = 0.5·(−1) − 1");
    fresh.send(0, init);
    assert_eq!(fresh.replies()[0].error_code(), ErrorCode::DuplicateInit, "a second init is a duplicate again");
    let mut wrong = harness(1);
    wrong.core.restore(crate::ps::checkpoint::read_shard(&dir.join(&file.file)).unwrap()).unwrap();
    let mut bad = data(Command::Push, Flags::INIT, &[(1, vec![0.0; 4])]);
    bad.meta.text = r#"["w"]"#.into();
    wrong.send(0, bad);
    let refused = wrong.replies().remove(0);
    assert_eq!(refused.error_code(), ErrorCode::ShapeMismatch);
    assert!(refused.meta.text.contains("the checkpoint holds key w"), "{}", refused.meta.text);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A primary (rank 0) and the backup copy of its partition on server 1, wired by hand: every
/// `Replicate` message the primary sends is applied by the backup core, whose acknowledgement
/// releases the primary's replies.
struct Pair {
    primary: Harness,
    backup: Harness,
    link: OutboxRx,
}

fn pair(workers: u32) -> Pair {
    pair_with(settings(workers))
}

/// A [`Pair`] of servers with `s` (their rank, server count and replicas set here).
fn pair_with(s: Settings) -> Pair {
    let s = Settings { rank: 0, num_servers: 2, replicas: true, ..s };
    let primary = harness_with(s.clone());
    let backup = harness_with(Settings { rank: 1, ..s });
    let (link, rx) = Outbox::unbounded();
    let mut p = Pair { primary, backup, link: rx };
    p.primary.core.on_event(Event::Backup { partition: 0, link: Some(link) });
    p
}

impl Pair {
    /// Delivers the replication messages to the backup and, if `ack`, its acknowledgements.
    fn replicate(&mut self, ack: bool) -> usize {
        let mut n = 0;
        while let Some(m) = self.link.try_recv() {
            assert_eq!((m.command, m.partition), (Command::Replicate, Some(0)));
            let seq = m.request_id;
            self.backup.core.on_event(Event::Replicate { msg: m, admission: Admission::default() });
            if ack {
                self.primary.core.on_event(Event::ReplicaAck { partition: 0, seq });
            }
            n += 1;
        }
        n
    }
}

/// A push of `value` to `key` carrying round id `round`.
fn push_of_round(key: u64, value: Vec<f32>, round: u64) -> Message {
    let mut m = data(Command::Push, Flags::NONE, &[(key, value)]);
    m.meta.rounds.push(round);
    m
}

fn for_partition_0(mut m: Message) -> Message {
    m.partition = Some(0);
    m
}

#[test]
fn a_backup_copy_follows_its_primary_bit_for_bit_and_replies_wait_for_its_acknowledgement() {
    let mut p = pair(2);
    assert!(p.replicate(true) >= 2, "a snapshot (BEGIN … END) goes to a new backup");
    let sgd = Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }).with_learning_rate(0.1);
    p.primary.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), sgd.to_json().into()));
    p.primary.send(0, data(Command::Push, Flags::INIT, &[(7, vec![1.0; 5])]));
    assert!(p.primary.replies().is_empty(), "no reply before the backup acknowledged the change");
    p.replicate(true);
    assert_eq!(p.primary.replies().len(), 2);
    for round in 0..3u64 {
        for w in 0..2 {
            p.primary.send(w, push_of_round(7, vec![(w + 1) as f32 * 0.3; 5], round));
        }
        assert!(p.primary.replies().is_empty());
        p.replicate(true);
        assert_eq!(p.primary.replies().len(), 2, "round {round} answered once acknowledged");
    }
    let want = p.primary.pull(7, 5);
    // The primary dies: the backup is promoted and serves the partition with the same bits.
    p.backup.core.on_event(Event::Promote(vec![0]));
    p.backup.send(0, for_partition_0(pull_of(7, 5)));
    let r = p.backup.replies();
    assert_eq!(r[0].command, Command::Reply, "{}", r[0].meta.text);
    let got = values(&r[0]).remove(0);
    assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());

    // A worker re-sends its last push (round 2) after the failover: acknowledged, not applied
    // again; without RETRY the same push is a refused duplicate.
    let mut again = data(Command::Push, Flags::RETRY, &[(7, vec![0.3; 5])]);
    again.meta.rounds.push(2);
    p.backup.send(0, for_partition_0(again.clone()));
    assert_eq!(p.backup.replies()[0].command, Command::Reply);
    again.flags = Flags::NONE;
    p.backup.send(0, for_partition_0(again));
    let r = p.backup.replies();
    assert_eq!((r[0].command, r[0].meta.head), (Command::Error, ErrorCode::DuplicatePush as i32), "{}", r[0].meta.text);
    // The next round goes on from the backup's round id.
    for w in 0..2 {
        p.backup.send(w, for_partition_0(push_of_round(7, vec![1.0; 5], 3)));
    }
    assert_eq!(p.backup.replies().len(), 2, "round 3 completes on the promoted copy");
}

#[test]
fn requests_wait_for_the_first_backup_link_and_a_partition_not_held_here_is_refused() {
    let s = Settings { num_servers: 2, replicas: true, ..settings(1) };
    let mut h = harness_with(s);
    h.send(0, data(Command::Push, Flags::INIT, &[(1, vec![2.0; 2])]));
    assert!(h.replies().is_empty(), "parked until the partition has its backup");
    h.core.on_event(Event::Backup { partition: 0, link: None });
    assert_eq!(h.replies()[0].command, Command::Reply);
    // A request for partition 1, of which this server keeps no copy, is refused at once.
    h.send(0, Message { partition: Some(1), ..pull_of(1, 2) });
    let r = h.replies();
    assert_eq!(r[0].command, Command::Error);
    assert!(r[0].meta.text.contains("partition 1 is not held"), "{}", r[0].meta.text);
}

#[test]
fn round_ids_tell_a_restarted_worker_where_its_predecessor_stopped() {
    let mut h = harness(2);
    h.init(&[(5, vec![0.0; 2])]);
    let ask = |h: &mut Harness, worker: u32| {
        let mut m = Message::new(Command::Pull).with_flags(Flags::ROUND_IDS);
        m.meta.push_key(5, 0, 0);
        h.send(worker, m);
        let r = h.replies();
        assert_eq!(r[0].command, Command::Reply, "{}", r[0].meta.text);
        r[0].meta.rounds[0]
    };
    assert_eq!((ask(&mut h, 0), ask(&mut h, 1)), (0, 0));
    // Worker 0 pushed round 0 and queued round 1; worker 1 nothing yet.
    for round in [0, 1] {
        h.send(0, push_of_round(5, vec![1.0; 2], round));
    }
    assert_eq!((ask(&mut h, 0), ask(&mut h, 1)), (2, 0));
    // Async: the next id of each worker.
    let mut h = harness(2);
    h.send(0, Message::server_command(ServerCmd::SyncMode.id(), "async".into()));
    h.replies();
    h.init(&[(5, vec![0.0; 2])]);
    for round in 0..3 {
        h.send(1, push_of_round(5, vec![1.0; 2], round));
    }
    h.replies();
    assert_eq!((ask(&mut h, 0), ask(&mut h, 1)), (0, 3));
}

/// Two servers, each holding one part of a key, hear of worker 1's death at different times:
/// server A completes round 3 without it, server B never notices (its death and return
/// reached B together). The restarted worker asks both parts' round ids (4 and 3), then
/// rejoins both at the latest, 4: B's round 3 completes without it, and from round 4 on both
/// parts sum the same pushes — the key's parts stay in step.
#[test]
fn a_restarted_worker_rejoins_every_part_of_a_key_at_the_same_round() {
    let (mut a, mut b) = (harness(2), harness(2));
    for h in [&mut a, &mut b] {
        h.init(&[(5, vec![0.0; 2])]);
        for round in 0..3 {
            for w in 0..2 {
                h.send(w, push_of_round(5, vec![1.0; 2], round));
            }
        }
        assert_eq!(h.replies().len(), 6);
        // Worker 0's push of round 3 waits for worker 1, which dies.
        h.send(0, push_of_round(5, vec![1.0; 2], 3));
    }
    a.core.on_event(Event::WorkersDone(crate::ps::cluster::Absent::new([1], 1)));
    assert_eq!(a.replies().len(), 1, "A completes round 3 without worker 1");
    assert!(b.replies().is_empty(), "B still waits for worker 1 in round 3");
    let ask = |h: &mut Harness, rejoin: Option<u64>| {
        let mut m = Message::new(Command::Pull).with_flags(Flags::ROUND_IDS);
        m.meta.push_key(5, 0, 0);
        m.meta.rounds.extend(rejoin);
        let id = h.send(1, m);
        let r: Vec<Message> = h.replies();
        let reply = r.iter().find(|m| m.request_id == id).unwrap();
        assert_eq!(reply.command, Command::Reply, "{}", reply.meta.text);
        (reply.meta.rounds[0], r.len() - 1)
    };
    assert_eq!((ask(&mut a, None).0, ask(&mut b, None).0), (4, 3), "the parts disagree");
    assert_eq!(ask(&mut a, Some(4)), (4, 0));
    assert_eq!(ask(&mut b, Some(4)), (4, 1), "B's round 3 completes without worker 1: worker 0 hears");
    // A hears of the return only now (a move): round 4 waits for worker 1 on both anyway.
    a.core.on_event(Event::WorkersDone(crate::ps::cluster::Absent::new([], 2)));
    for h in [&mut a, &mut b] {
        h.send(0, push_of_round(5, vec![1.0; 2], 4));
        assert!(h.replies().is_empty(), "round 4 waits for the restarted worker");
        h.send(1, push_of_round(5, vec![10.0; 2], 4));
        assert_eq!(h.replies().len(), 2);
    }
    assert_eq!(a.pull(5, 2), b.pull(5, 2));
    // A push below the round it rejoined at is refused, not applied.
    b.send(1, push_of_round(5, vec![1.0; 2], 3));
    assert_eq!(b.replies()[0].error_code(), ErrorCode::DuplicatePush);
    // Rejoining names one round per key part, in sync mode only.
    let mut m = Message::new(Command::Pull).with_flags(Flags::ROUND_IDS);
    m.meta.push_key(5, 0, 0);
    m.meta.rounds.extend([5, 5]);
    b.send(1, m);
    let r = b.replies();
    assert_eq!(r[0].command, Command::Error);
    assert!(r[0].meta.text.contains("one round per key part"), "{}", r[0].meta.text);
}

/// A restarted worker rejoins a key part at round 4 while the part's round 3 is still open
/// (worker 0 has not pushed it), and the primary dies before round 3 completes. The promoted
/// backup — the live one, or one made from a snapshot taken after the rejoin — has the hold:
/// it takes worker 1's re-sent push of round 4, completes round 3 with worker 0's push alone
/// and round 4 with both. Without the hold, round 3 would wait for worker 1 and its push of
/// round 4 would be refused (`RoundGap`).
#[test]
fn a_rejoined_workers_hold_reaches_the_backup_and_holds_after_a_failover() {
    use crate::ps::cluster::Absent;
    for from_snapshot in [false, true] {
        let mut p = pair(2);
        p.replicate(true);
        p.primary.send(0, data(Command::Push, Flags::INIT, &[(5, vec![0.0; 2])]));
        p.replicate(true);
        for round in 0..3 {
            for w in 0..2 {
                p.primary.send(w, push_of_round(5, vec![1.0; 2], round));
            }
            p.replicate(true);
        }
        assert_eq!(p.primary.replies().len(), 7, "the init and rounds 0-2");
        // Worker 1 died and came back; every server hears of both.
        for h in [&mut p.primary, &mut p.backup] {
            h.core.on_event(Event::WorkersDone(Absent::new([1], 1)));
            h.core.on_event(Event::WorkersDone(Absent::new([], 2)));
        }
        let mut rejoin = Message::new(Command::Pull).with_flags(Flags::ROUND_IDS);
        rejoin.meta.push_key(5, 0, 0);
        rejoin.meta.rounds.push(4);
        p.primary.send(1, rejoin);
        assert!(p.primary.replies().is_empty(), "the answer to a rejoin waits for the backup");
        assert_eq!(p.replicate(true), 1, "one HOLDS message");
        let r = p.primary.replies();
        assert_eq!((r[0].command, r[0].meta.rounds.clone()), (Command::Reply, vec![4]), "{}", r[0].meta.text);
        p.primary.send(1, push_of_round(5, vec![10.0; 2], 4));
        assert!(p.primary.replies().is_empty(), "queued for round 4");

        let mut backup = if from_snapshot {
            let mut fresh = harness_with(Settings { rank: 1, num_servers: 2, replicas: true, ..settings(2) });
            fresh.core.on_event(Event::WorkersDone(Absent::new([], 2)));
            let (link, mut rx) = Outbox::unbounded();
            p.primary.core.on_event(Event::Backup { partition: 0, link: Some(link) });
            while let Some(m) = rx.try_recv() {
                fresh.core.on_event(Event::Replicate { msg: m, admission: Admission::default() });
            }
            fresh
        } else {
            p.backup
        };
        // The primary dies; its backup is promoted. Worker 1 re-sends its push of round 4.
        backup.core.on_event(Event::Promote(vec![0]));
        let mut again = data(Command::Push, Flags::RETRY, &[(5, vec![10.0; 2])]);
        again.meta.rounds.push(4);
        backup.send(1, for_partition_0(again));
        let r = backup.replies();
        assert!(r.is_empty(), "taken for round 4 (snapshot: {from_snapshot}): {:?}", r.iter().map(|m| &m.meta.text).collect::<Vec<_>>());
        backup.send(0, for_partition_0(push_of_round(5, vec![1.0; 2], 3)));
        let r = backup.replies();
        assert_eq!((r.len(), r[0].command), (1, Command::Reply), "round 3 completes without worker 1: {}", r[0].meta.text);
        backup.send(0, for_partition_0(push_of_round(5, vec![1.0; 2], 4)));
        assert_eq!(backup.replies().len(), 2, "round 4 completes with both workers");
        backup.send(0, for_partition_0(pull_of(5, 2)));
        assert_eq!(values(&backup.replies()[0]), vec![vec![11.0; 2]]);
    }
}

/// The rounds one request completes run as a batch on several threads (`partition/batch.rs`):
/// the values, optimizer states and counts are those of the updates run one after another
/// (checked bit for bit against an [`Updater`](crate::optimizer::Updater) driven key by key),
/// with a learning-rate schedule that depends on `num_update`, and pushpull answers carry the
/// updated values.
#[test]
fn rounds_completed_together_update_in_parallel_exactly_as_one_by_one() {
    use super::core::UpdateThreads;
    // A pool of its own (SYNKV_SERVER_THREADS=3), and everything on the core thread (=1).
    let ran = batch_case(UpdateThreads::new(Some(3)));
    assert!(ran >= 3 * 24, "every round of the 24 keys ran in a parallel batch ({ran})");
    batch_case(UpdateThreads::One);
}

/// Runs three rounds of 24 keys from 2 workers with `threads`, checking every value and state
/// against an updater driven key by key; returns the rounds that ran in parallel batches
/// (counted process-wide: other tests may add to it, never take from it).
fn batch_case(threads: super::core::UpdateThreads) -> u64 {
    use crate::optimizer::{Adam, GradRef, LrScheduler, Updater, WeightMut};
    let (keys, len) = (24u64, 8192usize);
    let adam = Optimizer::from(Adam::default()).with_learning_rate(0.05).with_lr_scheduler(LrScheduler::factor(1, 0.5)).with_wd(0.01);
    let mut h = harness_with(Settings { threads, ..settings(2) });
    h.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), adam.to_json().into()));
    assert_eq!(h.replies()[0].command, Command::Reply);
    let init: Vec<(u64, Vec<f32>)> = (0..keys).map(|k| (k, (0..len).map(|i| ((i as f32) * 0.001).sin() + k as f32).collect())).collect();
    h.init(&init);
    let mut reference = Updater::try_new(adam.clone()).unwrap();
    let mut expected: Vec<Vec<f32>> = init.iter().map(|(_, v)| v.clone()).collect();
    let before = crate::ps::metrics::METRICS.server.parallel_rounds.get();
    for round in 0..3u64 {
        let grad =
            |w: u64, k: u64| -> Vec<f32> { (0..len).map(|i| ((i as u64 * 7 + k * 13 + w * 5 + round) % 17) as f32 * 0.1 - 0.8).collect() };
        let push = |w: u64| -> Vec<(u64, Vec<f32>)> { (0..keys).map(|k| (k, grad(w, k))).collect() };
        h.send(0, data(Command::PushPull, Flags::NONE, &push(0)));
        assert!(h.replies().is_empty(), "waits for worker 1");
        h.send(1, data(Command::PushPull, Flags::NONE, &push(1)));
        for (k, w) in expected.iter_mut().enumerate() {
            let k = k as u64;
            let sum: Vec<f32> = grad(0, k).iter().zip(grad(1, k)).map(|(a, b)| a + b).collect();
            reference.update_as(&k.to_string(), &k.to_string(), WeightMut::F32(w), GradRef::F32(&sum)).unwrap();
        }
        let r = h.replies();
        assert_eq!(r.len(), 2, "both pushpulls answered");
        for reply in &r {
            assert_eq!(reply.command, Command::Reply, "{}", reply.meta.text);
            assert_eq!(values(reply), expected, "round {round}: the answers carry the values of the sequential updates");
        }
    }
    for k in 0..keys {
        assert_eq!(h.pull(k, len as u64), expected[k as usize]);
    }
    // The optimizer states (and counts) match the sequential updater's, byte for byte.
    let mut loaded = Updater::try_new(adam).unwrap();
    let mut after: Option<String> = None;
    loop {
        let body = serde_json::json!({ "after": after }).to_string();
        h.send(0, Message::server_command(ServerCmd::GetOptimizerStates.id(), body.into()));
        let page = h.replies().remove(0);
        assert_eq!(page.command, Command::Reply, "{}", page.meta.text);
        loaded.merge_states(&page.chunks[0].data, false).unwrap();
        let cursor: serde_json::Value = serde_json::from_str(&page.meta.text).unwrap();
        match cursor["next"].as_str() {
            Some(k) => after = Some(k.to_owned()),
            None => break,
        }
    }
    assert_eq!(loaded.state_count(), keys as usize);
    assert!(loaded.save_states() == reference.save_states(), "states, counts and num_update differ from the sequential updater's");
    crate::ps::metrics::METRICS.server.parallel_rounds.get() - before
}

/// With a backup copy, the rounds one request completes still run as a parallel batch: the
/// backup gets each round's change in the batch's order and, promoted, serves the same bits;
/// both equal those of a primary updating one by one.
#[test]
fn replicated_rounds_completed_together_update_in_parallel_and_the_backup_follows_bit_for_bit() {
    use super::core::UpdateThreads;
    let before = crate::ps::metrics::METRICS.server.parallel_rounds.get();
    let (parallel, backup) = replicated_batch_case(UpdateThreads::new(Some(3)));
    let ran = crate::ps::metrics::METRICS.server.parallel_rounds.get() - before;
    assert!(ran >= 2 * 3 * 16, "the updates (3 rounds) and assigns (3 rounds) of 16 keys ran in parallel batches ({ran})");
    let (one_by_one, _) = replicated_batch_case(UpdateThreads::One);
    let bits = |v: &[Vec<f32>]| v.iter().map(|x| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>();
    assert!(bits(&parallel) == bits(&backup), "the promoted backup serves the primary's values");
    assert!(bits(&parallel) == bits(&one_by_one), "a parallel batch updates exactly as one by one");
}

/// 16 keys × 8192 f32, 2 workers: 3 rounds of pushes assigned, then 3 under Adam (a schedule
/// on `num_update`), every request completing 16 rounds at once; returns the
/// primary's values and those the backup serves once promoted.
fn replicated_batch_case(threads: super::core::UpdateThreads) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    use crate::optimizer::{Adam, LrScheduler};
    let (keys, len) = (16u64, 8192usize);
    let mut p = pair_with(Settings { threads, ..settings(2) });
    p.replicate(true);
    let answered = |p: &mut Pair, n: usize| {
        p.replicate(true);
        let r = p.primary.replies();
        assert_eq!(r.len(), n, "answered once the backup acknowledged");
        assert!(r.iter().all(|m| m.command == Command::Reply), "{:?}", r.iter().map(|m| &m.meta.text).collect::<Vec<_>>());
    };
    let init: Vec<(u64, Vec<f32>)> = (0..keys).map(|k| (k, (0..len).map(|i| ((i as f32) * 0.001).cos() + k as f32).collect())).collect();
    p.primary.send(0, data(Command::Push, Flags::INIT, &init));
    answered(&mut p, 1);
    let grad = |w: u64, k: u64, round: u64| -> Vec<f32> {
        (0..len).map(|i| ((i as u64 * 3 + k * 11 + w * 7 + round) % 19) as f32 * 0.1 - 0.9).collect()
    };
    for round in 0..6u64 {
        if round == 3 {
            // Rounds 0-2 assigned the sums (no optimizer: an assign's change is the new
            // value); from here on Adam updates them (the change is the sum).
            let adam = Optimizer::from(Adam::default()).with_learning_rate(0.05).with_lr_scheduler(LrScheduler::factor(1, 0.5));
            p.primary.send(0, Message::server_command(ServerCmd::SetOptimizer.id(), adam.to_json().into()));
            answered(&mut p, 1);
        }
        for w in 0..2 {
            p.primary.send(
                u32::try_from(w).unwrap(),
                data(Command::Push, Flags::NONE, &(0..keys).map(|k| (k, grad(w, k, round))).collect::<Vec<_>>()),
            );
        }
        answered(&mut p, 2);
    }
    let primary: Vec<Vec<f32>> = (0..keys).map(|k| p.primary.pull(k, len as u64)).collect();
    p.backup.core.on_event(Event::Promote(vec![0]));
    let backup = (0..keys)
        .map(|k| {
            p.backup.send(0, for_partition_0(pull_of(k, len as u64)));
            let r = p.backup.replies();
            assert_eq!(r[0].command, Command::Reply, "{}", r[0].meta.text);
            values(&r[0]).remove(0)
        })
        .collect();
    (primary, backup)
}

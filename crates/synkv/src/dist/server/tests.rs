//! Unit tests of the server core, driven event by event without sockets: init, sync rounds
//! counting distinct workers (K12.10), pushpull replies, async apply, commands.

use tokio::sync::mpsc;

use super::core::{Core, Event};
use super::ServerCmd;
use crate::dist::codec;
use crate::dist::node::NodeId;
use crate::dist::proto::{Command, Flags, Message};
use crate::ndarray::Buffer;
use crate::optimizer::{Optimizer, Sgd};

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

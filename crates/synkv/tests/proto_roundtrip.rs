//! Property tests of `ps::proto`: encode → check → parse is the identity, and arbitrary or
//! mutated bytes never make `check`/`parse` panic (a quick, in-process fuzz target).

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use synkv::ps::proto::*;
use synkv::ps::{Node, NodeId, Role};

fn limits() -> Limits {
    Limits::default()
}

fn arb_node() -> impl Strategy<Value = Node> {
    (
        prop_oneof![Just(Role::Scheduler), Just(Role::Server), Just(Role::Worker)],
        any::<u32>(),
        any::<Option<u32>>(),
        "[a-z0-9.:é]{0,20}",
        any::<u16>(),
        any::<Option<u32>>(),
    )
        .prop_map(|(role, id, rank, host, port, task_id)| Node {
            role,
            id: NodeId(id),
            rank: rank.filter(|r| *r != u32::MAX),
            host,
            port,
            task_id: task_id.filter(|t| *t != u32::MAX),
        })
}

fn arb_chunk() -> impl Strategy<Value = Chunk> {
    (0u8..13, proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(code, mut data)| {
        let dtype = DTypeCode::try_from(code).unwrap();
        let size = usize::try_from(dtype.size()).unwrap();
        data.truncate(data.len() / size * size);
        Chunk { dtype, data: Bytes::from(data) }
    })
}

fn arb_message() -> impl Strategy<Value = Message> {
    (
        proptest::sample::select(Command::ALL.to_vec()),
        0u16..8,
        any::<u32>(),
        any::<u64>(),
        proptest::collection::vec(any::<u64>(), 0..6),
        proptest::collection::vec(arb_chunk(), 0..4),
        any::<i32>(),
        any::<i32>(),
        proptest::collection::vec(arb_node(), 0..3),
        ".{0,30}",
        (any::<bool>(), any::<bool>(), any::<u64>(), proptest::option::of(0u16..u16::MAX), any::<bool>()),
    )
        .prop_map(
            |(command, flags, sender, request_id, keys, chunks, priority, head, nodes, text, (offsets, rounds, seed, partition, retry))| {
                let total: u64 = chunks.iter().map(|c| c.data.len() as u64).sum();
                // Key lengths partition the chunk bytes (all on the first key) when both exist.
                let mut lens = vec![0; keys.len()];
                if let Some(first) = lens.first_mut() {
                    *first = total;
                }
                // Per-key offsets and round ids, present or not (flags OFFSETS/ROUNDS on the wire).
                let per_key = |on: bool, mul: u64| -> Vec<u64> {
                    if on && !keys.is_empty() {
                        (0..keys.len() as u64).map(|i| seed.wrapping_mul(mul).wrapping_add(i)).collect()
                    } else {
                        Vec::new()
                    }
                };
                let (offsets, rounds) = (per_key(offsets, 3), per_key(rounds, 7));
                Message {
                    command,
                    flags: Flags::try_from(flags | if retry { Flags::RETRY.bits() } else { 0 }).unwrap(),
                    partition,
                    sender: NodeId(sender),
                    request_id,
                    meta: Meta { keys, lens, offsets, rounds, priority, head, nodes, text },
                    chunks,
                }
            },
        )
}

proptest! {
    #[test]
    fn prop_round_trip(m in arb_message()) {
        let b = m.encode_to_bytes(&limits()).unwrap();
        prop_assert_eq!(check(&b, &limits()), Ok(Some(b.len())));
        // A second frame behind the first does not change the answer.
        let mut two = BytesMut::from(&b[..]);
        two.extend_from_slice(&b);
        prop_assert_eq!(check(&two, &limits()), Ok(Some(b.len())));
        prop_assert_eq!(parse(b, &limits()), Ok(m));
    }

    #[test]
    fn prop_random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(Some(n)) = check(&data, &limits()) {
            let _ = parse(Bytes::copy_from_slice(&data[..n]), &limits());
        }
        let _ = parse(Bytes::from(data), &limits());
    }

    #[test]
    fn prop_mutated_frames_never_panic(m in arb_message(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut b = BytesMut::from(&m.encode_to_bytes(&limits()).unwrap()[..]);
        for (at, v) in flips {
            let i = at % b.len();
            b[i] = v;
        }
        if let Ok(Some(n)) = check(&b, &limits()) {
            let _ = parse(b.freeze().slice(..n), &limits());
        }
    }
}

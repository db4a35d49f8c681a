//! Property test: random read/write ops over a few vars execute in an order consistent with
//! submission order for every conflicting pair (two ops sharing a var, at least one writing it).

use std::time::Duration;

use proptest::prelude::*;

use super::{watchdog, Log};
use crate::engine::{Engine, Var};

const VARS: usize = 4;

#[derive(Clone, Debug)]
struct OpSpec {
    reads: u8,
    writes: u8,
    priority: i32,
    asynchronous: bool,
    sleep: bool,
}

fn op_spec() -> impl Strategy<Value = OpSpec> {
    (0u8..16, 0u8..16, -2i32..3, any::<bool>(), prop::bool::weighted(0.1))
        .prop_map(|(reads, writes, priority, asynchronous, sleep)| OpSpec { reads, writes, priority, asynchronous, sleep })
}

fn pick(vars: &[Var], mask: u8) -> Vec<Var> {
    (0..VARS).filter(|i| mask & (1 << i) != 0).map(|i| vars[i].clone()).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Start(usize),
    End(usize),
}

fn conflicts(a: &OpSpec, b: &OpSpec) -> bool {
    (a.writes & (b.reads | b.writes)) != 0 || (b.writes & a.reads) != 0
}

fn check(specs: Vec<OpSpec>, threads: usize) {
    let engine = Engine::new(threads);
    let vars: Vec<Var> = (0..VARS).map(|_| Var::new()).collect();
    let log: Log<Event> = Log::default();
    for (i, spec) in specs.iter().enumerate() {
        let (reads, writes) = (pick(&vars, spec.reads), pick(&vars, spec.writes));
        let (log, sleep) = (log.clone(), spec.sleep);
        let pause = move || {
            if sleep {
                std::thread::sleep(Duration::from_micros(200));
            } else {
                std::thread::yield_now();
            }
        };
        if spec.asynchronous {
            engine.push_async("prop-async", &reads, &writes, spec.priority, move |c| {
                log.push(Event::Start(i));
                std::thread::spawn(move || {
                    pause();
                    log.push(Event::End(i));
                    c.done();
                });
            });
        } else {
            engine.push("prop-sync", &reads, &writes, spec.priority, move || {
                log.push(Event::Start(i));
                pause();
                log.push(Event::End(i));
                Ok(())
            });
        }
    }
    engine.wait_all().unwrap();
    let events = log.snapshot();
    assert_eq!(events.len(), 2 * specs.len(), "some op never ran");
    let mut start = vec![usize::MAX; specs.len()];
    let mut end = vec![usize::MAX; specs.len()];
    for (pos, event) in events.iter().enumerate() {
        match *event {
            Event::Start(i) => start[i] = pos,
            Event::End(i) => end[i] = pos,
        }
    }
    for j in 0..specs.len() {
        for i in 0..j {
            if conflicts(&specs[i], &specs[j]) {
                assert!(end[i] < start[j], "op {i} {:?} and later op {j} {:?} conflict but overlapped or reordered", specs[i], specs[j]);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn conflicting_ops_run_in_submission_order(
        specs in prop::collection::vec(op_spec(), 1..40),
        threads in 1usize..4,
    ) {
        watchdog(move || check(specs, threads));
    }
}

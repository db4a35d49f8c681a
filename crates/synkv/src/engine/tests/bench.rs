//! Micro-benchmarks, ignored by default. Run with
//! `cargo test --release -- --ignored --nocapture engine_bench`.
//! Targets live here, never in timed assertions.

use std::time::Instant;

use crate::engine::{Engine, Var};

const OPS: usize = 100_000;

fn report(what: &str, threads: usize, start: Instant) {
    let secs = start.elapsed().as_secs_f64();
    println!("engine_bench {what:<28} threads={threads}: {:>10.0} ops/s, {:>6.2} us/op", OPS as f64 / secs, secs * 1e6 / OPS as f64);
}

#[test]
#[ignore = "benchmark; run with --release -- --ignored --nocapture"]
fn engine_bench() {
    for threads in [1, 2] {
        let engine = Engine::new(threads);
        engine.push("warm-up", &[], &[], 0, || Ok(()));
        engine.wait_all().unwrap();

        let vars: Vec<Var> = (0..OPS).map(|_| Var::new()).collect();
        let start = Instant::now();
        for var in &vars {
            engine.push("independent", &[], std::slice::from_ref(var), 0, || Ok(()));
        }
        engine.wait_all().unwrap();
        report("independent (own var)", threads, start);

        let start = Instant::now();
        for _ in 0..OPS {
            engine.push("no-vars", &[], &[], 0, || Ok(()));
        }
        engine.wait_all().unwrap();
        report("independent (no vars)", threads, start);

        let v = Var::new();
        let start = Instant::now();
        for _ in 0..OPS {
            engine.push("chain", &[], std::slice::from_ref(&v), 0, || Ok(()));
        }
        engine.wait_all().unwrap();
        report("chained writes on one var", threads, start);

        let start = Instant::now();
        for _ in 0..OPS {
            engine.push_async("chain-async", &[], std::slice::from_ref(&v), 0, |c| c.done());
        }
        engine.wait_all().unwrap();
        report("chained async on one var", threads, start);

        let (a, b) = (Var::new(), Var::new());
        let start = Instant::now();
        for _ in 0..OPS {
            engine.push("b=f(a)", std::slice::from_ref(&a), std::slice::from_ref(&b), 0, || Ok(()));
        }
        engine.wait_all().unwrap();
        report("chained 2-var (read a, write b)", threads, start);

        // Round trip on an idle engine: push, run on the pool, wait. Includes the wake-up.
        let start = Instant::now();
        for _ in 0..OPS / 10 {
            engine.push("round-trip", &[], std::slice::from_ref(&v), 0, || Ok(()));
            engine.wait_to_read(&v).unwrap();
        }
        let secs = start.elapsed().as_secs_f64();
        println!("engine_bench {:<28} threads={threads}: {:>6.2} us/op", "push+wait round trip (idle)", secs * 1e6 / (OPS / 10) as f64);
    }
}

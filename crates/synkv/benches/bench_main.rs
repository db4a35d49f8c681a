//! Criterion benches for synkv (candle's layout: this file plus one module per area).
//! Every bench waits for the engine before stopping the clock.

use criterion::{criterion_group, criterion_main};

criterion_group!(benches);
criterion_main!(benches);

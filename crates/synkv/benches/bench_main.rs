//! Criterion benches for synkv (candle's layout: this file plus one module per area).
//! Every bench waits for the engine before stopping the clock.

mod kernels;

use criterion::{criterion_group, criterion_main, Criterion};
use synkv::{create, NDArray};

/// push + pull of 1000 small keys through a `local` store.
fn store_small_keys(c: &mut Criterion) {
    let kv = create("local").expect("local store");
    let keys: Vec<i32> = (0..1000).collect();
    let vals: Vec<NDArray> = keys.iter().map(|_| NDArray::ones([1024])).collect();
    kv.init(&keys, &vals).expect("init");
    let outs: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros([1024])).collect();
    c.bench_function("store/push+pull 1000 keys x 1K f32", |b| {
        b.iter(|| {
            kv.push(&keys, &vals).expect("push");
            kv.pull(&keys, &outs).expect("pull");
            kv.wait_all().expect("wait");
        })
    });
}

criterion_group!(benches, store_small_keys, kernels::benches);
criterion_main!(benches);

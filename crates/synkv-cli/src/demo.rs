//! `synkv demo`: the MXNet KVStore tutorial (Perl edition) step by step on a `local` store,
//! printing every pulled array the way the tutorial does.

use anyhow::Result;
use synkv::{create, Context, NDArray};

pub(crate) fn run() -> Result<()> {
    println!("synkv demo: the MXNet KVStore tutorial's steps on a `local` store\n");
    let kv = create("local")?;
    let shape = [2, 3];

    step("$kv->init(3, ones([2,3]) * 2); $kv->pull(3, out => $a)");
    let twos = (&NDArray::ones(shape) * 2.0)?;
    kv.init(3, &twos)?;
    let a = NDArray::zeros(shape);
    kv.pull(3, &a)?;
    show(&a)?;

    step("$kv->push(3, ones([2,3]) * 8); $kv->pull(3, out => $a)");
    let eights = (&NDArray::ones(shape) * 8.0)?;
    kv.push(3, &eights)?;
    kv.pull(3, &a)?;
    show(&a)?;

    step("$kv->push(3, [ones on cpu(0), ones on cpu(1)]); $kv->pull(3, out => $a)");
    let two = [NDArray::ones_on(shape, Context::cpu(0)), NDArray::ones_on(shape, Context::cpu(1))];
    kv.push(3, &two)?;
    kv.pull(3, &a)?;
    show(&a)?;

    step("$kv->_set_updater(sub { print \"update on key: $key\\n\"; $stored += $input * 3 }); push the two again");
    kv.set_updater(|key, input, stored| {
        println!("update on key: {key}");
        stored.add_assign(&(input * 3.0)?)?;
        Ok(())
    });
    kv.push(3, &two)?;
    kv.pull(3, &a)?;
    show(&a)?;

    step("$kv->pull(3, out => [zeros on cpu(0), zeros on cpu(1)]); print $b->[1]");
    let b = [NDArray::zeros_on(shape, Context::cpu(0)), NDArray::zeros_on(shape, Context::cpu(1))];
    kv.pull(3, &b)?;
    show(&b[1])?;

    step("$keys = [5,7,9]; $kv->init($keys, ones x3); $kv->push($keys, ones x3)");
    let keys = [5, 7, 9];
    let ones: Vec<NDArray> = keys.iter().map(|_| NDArray::ones(shape)).collect();
    kv.init(keys, &ones)?;
    let grads: Vec<NDArray> = keys.iter().map(|_| NDArray::ones(shape)).collect();
    kv.push(keys, &grads)?;
    let outs: Vec<NDArray> = keys.iter().map(|_| NDArray::ones(shape)).collect();
    kv.pull(keys, &outs)?;
    kv.wait_all()?;
    step("$kv->pull($keys, out => $b); print $b->[1]");
    show(&outs[1])?;
    Ok(())
}

fn step(what: &str) {
    println!("pdl> {what}");
}

/// Prints an array once its pending writes are done. (Waiting inside `println!` would hold the
/// stdout lock while an updater that prints — the tutorial's does — waits for it: a deadlock.)
fn show(a: &NDArray) -> Result<()> {
    a.wait_to_read()?;
    let text = a.to_string();
    println!("{text}");
    Ok(())
}

//! Regenerates `include/synkv.h` from this crate's source with cbindgen.
//!
//! Run `cargo run -p synkv-capi --example gen-header` after changing an exported item;
//! `tests/header.rs` fails while the checked-in header differs from what this writes.

use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    let bindings = cbindgen::generate_with_config(dir, config).expect("generate the header");
    let path = dir.join("include/synkv.h");
    bindings.write_to_file(&path);
    println!("wrote {}", path.display());
}

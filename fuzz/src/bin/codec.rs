//! afl target `codec`: see [`synkv_fuzz::codec`] and the crate's README.

fn main() {
    afl::fuzz!(|data: &[u8]| synkv_fuzz::codec(data));
}

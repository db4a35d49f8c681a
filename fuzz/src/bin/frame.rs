//! afl target `frame`: see [`synkv_fuzz::frame`] and the crate's README.

fn main() {
    afl::fuzz!(|data: &[u8]| synkv_fuzz::frame(data));
}

//! afl target `server`: see [`synkv_fuzz::server`] and the crate's README.
//!
//! The server's fuzz entry point exists only with `--cfg fuzzing`, which `cargo afl build`
//! sets; a plain `cargo build` gets a stub that says so.

#[cfg(fuzzing)]
fn main() {
    afl::fuzz!(|data: &[u8]| synkv_fuzz::server(data));
}

#[cfg(not(fuzzing))]
fn main() {
    eprintln!("the server target needs --cfg fuzzing: build it with `cargo afl build --release`");
    std::process::exit(2);
}

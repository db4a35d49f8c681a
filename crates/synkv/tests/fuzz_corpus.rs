//! Replays the committed fuzz corpus without afl: every file of `fuzz/corpus/<target>/` and
//! `fuzz/crashes/<target>/` goes through the same checks as the afl targets, which this test
//! includes from `fuzz/src/lib.rs` so the two cannot drift (issue 11, item 6;
//! `docs/fuzzing.md`).
//!
//! Inputs in `fuzz/crashes/` are the findings, replayed as regression tests now that they
//! are fixed (docs/fuzzing.md).
//!
//! The `server` target's entry point (`synkv::ps::server::fuzz`) exists only with
//! `--cfg fuzzing` or inside the crate's own unit tests, so here the server corpus is replayed
//! through the frame checks only (a unit test of `ps::server::fuzz` can replay it through the
//! server core).

use std::path::{Path, PathBuf};

#[path = "../../../fuzz/src/lib.rs"]
mod targets;

/// The files of `fuzz/<kind>/<target>/`, sorted (none if the directory does not exist).
fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz").join(kind).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.map(|e| e.expect("a readable corpus directory").path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

/// Runs `check` on every file of `fuzz/<kind>/<target>/`; fails naming every file that
/// panicked. Returns how many files ran.
fn replay(kind: &str, target: &str, check: fn(&[u8])) -> usize {
    let files = inputs(kind, target);
    let failed: Vec<String> = files
        .iter()
        .filter(|path| {
            let bytes = std::fs::read(path).expect("a readable corpus file");
            std::panic::catch_unwind(|| check(&bytes)).is_err()
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(failed.is_empty(), "{} of {} {target} inputs in fuzz/{kind} panicked:\n{}", failed.len(), files.len(), failed.join("\n"));
    files.len()
}

#[test]
fn frame_corpus_replays() {
    assert!(replay("corpus", "frame", targets::frame) >= 10, "the frame corpus is missing (fuzz/corpus/frame)");
}

#[test]
fn codec_corpus_replays() {
    assert!(replay("corpus", "codec", targets::codec) >= 10, "the codec corpus is missing (fuzz/corpus/codec)");
}

#[test]
fn server_corpus_replays_through_the_frame_checks() {
    assert!(replay("corpus", "server", targets::frame) >= 5, "the server corpus is missing (fuzz/corpus/server)");
}

#[test]
fn frame_crashes_replay() {
    replay("crashes", "frame", targets::frame);
}

#[test]
fn codec_crashes_replay() {
    replay("crashes", "codec", targets::codec);
}

#[test]
fn the_seeds_are_real_frames_and_state_files() {
    // A corpus that decodes to nothing would replay green while testing nothing.
    let limits = targets::FRAME_LIMITS;
    let stale = "after a wire or state-format change, regenerate the seeds: `cargo run --example seeds` in fuzz/ (fuzz/README.md)";
    for path in inputs("corpus", "frame").iter().chain(&inputs("corpus", "server")).filter(|p| file_name(p).starts_with("seed-")) {
        let bytes = std::fs::read(path).unwrap();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let len = match synkv::ps::proto::check(rest, &limits) {
                Ok(Some(len)) => len,
                Ok(None) => panic!("{}: ends in a partial frame; {stale}", path.display()),
                Err(e) => panic!("{}: {e}; {stale}", path.display()),
            };
            if let Err(e) = synkv::ps::proto::parse(bytes::Bytes::copy_from_slice(&rest[..len]), &limits) {
                panic!("{}: {e}; {stale}", path.display());
            }
            rest = &rest[len..];
        }
    }
    for path in inputs("corpus", "codec").iter().filter(|p| file_name(p).starts_with("seed-states")) {
        // Three selector bytes, then the state file.
        let bytes = std::fs::read(path).unwrap();
        if let Err(e) = synkv::optimizer::Updater::from_saved_states(&bytes[3..]) {
            panic!("{}: {e}; {stale}", path.display());
        }
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

//! Compiles the C programs in `examples/c/` with `cc` against the library cargo just built and
//! runs them: `test_capi.c` (assertions, linked to the shared library) and `tutorial.c` (the
//! KVStore tutorial, linked to the static library, its output compared with the expected text).
//! Every compile and run is bounded by a timeout.

mod util;

use std::process::Output;

use util::{command, compile, library_dir, run, RUN_TIMEOUT};

fn check(out: &Output, name: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{name} failed ({}):\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn c_test_program_passes_against_the_shared_library() {
    let lib = library_dir();
    let link = vec![format!("-L{}", lib.display()), "-lsynkv_capi".into(), format!("-Wl,-rpath,{}", lib.display()), "-lpthread".into()];
    let exe = compile("test_capi", &link);
    // cargo puts target/<profile> (whose copy of the library `cargo test` does not refresh) on
    // LD_LIBRARY_PATH, which wins over the rpath: point it at the library just linked.
    let mut cmd = command(exe);
    cmd.env("LD_LIBRARY_PATH", &lib);
    let stdout = check(&run(cmd, RUN_TIMEOUT), "test_capi");
    assert!(stdout.trim_end().ends_with(" passed, 0 failed"), "unexpected summary:\n{stdout}");
}

#[test]
fn c_tutorial_prints_the_tutorial_arrays_with_the_static_library() {
    let lib = library_dir();
    let link = vec![lib.join("libsynkv_capi.a").display().to_string(), "-lpthread".into(), "-ldl".into(), "-lm".into()];
    let exe = compile("tutorial", &link);
    let stdout = check(&run(command(exe), RUN_TIMEOUT), "tutorial");
    let block = |v: u32| format!("[\n [{v} {v} {v}]\n [{v} {v} {v}]\n]\n");
    let expected = [
        block(2),
        block(8),
        block(2),
        "update on key: 3\n".into(),
        block(8),
        block(8),
        block(8),
        "update on key: 5\nupdate on key: 7\nupdate on key: 9\n".into(),
        block(4),
        block(4),
        block(4),
    ]
    .concat();
    assert_eq!(stdout, expected);
}

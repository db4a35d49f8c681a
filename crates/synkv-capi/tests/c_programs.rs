//! Compiles the C programs in `examples/c/` with `cc` against the library cargo just built and
//! runs them: `test_capi.c` (assertions, linked to the shared library) and `tutorial.c` (the
//! KVStore tutorial, linked to the static library, its output compared with the expected text).
//! Every compile and run is bounded by a timeout.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const COMPILE_TIMEOUT: Duration = Duration::from_secs(180);
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The folder holding `libsynkv_capi.so` / `.a`: next to this test binary (`target/<profile>/deps`)
/// or its parent.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps folder").to_path_buf();
    for dir in [deps.clone(), deps.parent().expect("profile folder").to_path_buf()] {
        if dir.join("libsynkv_capi.so").exists() && dir.join("libsynkv_capi.a").exists() {
            return dir;
        }
    }
    panic!("libsynkv_capi.so / .a not found next to {}; build the crate first", exe.display());
}

/// Runs `cmd` to completion or kills it after `limit`.
fn run(mut cmd: Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: out_reader.join().unwrap_or_default(), stderr: err_reader.join().unwrap_or_default() }
}

/// Compiles `examples/c/<name>.c` with the link arguments given; returns the executable.
fn compile(name: &str, link: &[String]) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("synkv-capi-{name}"));
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples/c").join(format!("{name}.c")))
        .args(link)
        .arg("-o")
        .arg(&exe);
    let out = run(cc, COMPILE_TIMEOUT);
    assert!(out.status.success(), "compiling {name}.c failed:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

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
    let mut cmd = Command::new(exe);
    cmd.env("LD_LIBRARY_PATH", &lib);
    let stdout = check(&run(cmd, RUN_TIMEOUT), "test_capi");
    assert!(stdout.trim_end().ends_with(" passed, 0 failed"), "unexpected summary:\n{stdout}");
}

#[test]
fn c_tutorial_prints_the_tutorial_arrays_with_the_static_library() {
    let lib = library_dir();
    let link = vec![lib.join("libsynkv_capi.a").display().to_string(), "-lpthread".into(), "-ldl".into(), "-lm".into()];
    let exe = compile("tutorial", &link);
    let stdout = check(&run(Command::new(exe), RUN_TIMEOUT), "tutorial");
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

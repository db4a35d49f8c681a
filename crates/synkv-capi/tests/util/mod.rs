//! Helpers shared by the integration tests that compile C programs against the library and
//! run them (`c_programs.rs`, `dist.rs`): find the library cargo built, compile with `cc`, run
//! with a deadline, and build and find the `synkv` executable for distributed jobs. The
//! programs and jobs run from a clean environment ([`command`], shared with `synkv-cli`'s
//! tests): nothing a job reads is inherited from the caller's shell.
#![allow(dead_code)]

#[path = "../../../synkv-cli/tests/util/clean_env.rs"]
mod clean_env;

pub use clean_env::command;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(180);
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The folder holding `libsynkv_capi.so` / `.a`: next to this test binary (`target/<profile>/deps`)
/// or its parent.
pub fn library_dir() -> PathBuf {
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
pub fn run(mut cmd: Command, limit: Duration) -> Output {
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
pub fn compile(name: &str, link: &[String]) -> PathBuf {
    compile_as(name, name, link)
}

/// Compiles `examples/c/<name>.c` into an executable called `synkv-capi-<out>` (tests that run
/// in parallel give each compile its own output).
pub fn compile_as(name: &str, out: &str, link: &[String]) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("synkv-capi-{out}"));
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

/// Bound on building `synkv` (from scratch in a clean checkout: the whole workspace's deps).
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(900);

/// The `synkv` executable, to launch distributed jobs: `$SYNKV_BIN` when set, else the one
/// `cargo build -p synkv-cli` puts next to this crate's library (same target folder, same
/// profile). The build runs every time — a no-op when up to date — so a clean checkout works
/// and a stale `synkv` is never used.
pub fn synkv_exe() -> PathBuf {
    if let Some(bin) = std::env::var_os("SYNKV_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        assert!(bin.is_file(), "SYNKV_BIN={} is not a file; build synkv (cargo build -p synkv-cli) or unset SYNKV_BIN", bin.display());
        return bin;
    }
    let lib = library_dir();
    let profile_dir = if lib.ends_with("deps") { lib.parent().expect("profile folder").to_path_buf() } else { lib };
    let target_dir = profile_dir.parent().expect("target folder");
    let profile = profile_dir.file_name().and_then(|p| p.to_str()).expect("profile folder name");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo.args(["build", "-p", "synkv-cli", "--bin", "synkv"]).current_dir(&workspace).env("CARGO_TARGET_DIR", target_dir);
    match profile {
        "debug" => {}
        "release" => {
            cargo.arg("--release");
        }
        other => {
            cargo.args(["--profile", other]);
        }
    }
    let out = run(cargo, BUILD_TIMEOUT);
    assert!(
        out.status.success(),
        "building synkv failed (set SYNKV_BIN to a built synkv to skip this step):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exe = profile_dir.join("synkv");
    assert!(exe.is_file(), "cargo built synkv-cli but {} is missing", exe.display());
    exe
}

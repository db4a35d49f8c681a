//! `synkv bench … --plot` and the progress bars, as a pipe sees them: charts are written,
//! and output that is not a terminal carries no escape codes or carriage returns.

use crate::util::{command, run_bounded, synkv};

/// Fails if `output` holds a control character other than newline and tab.
fn assert_plain(output: &str) {
    let bad: Vec<char> = output.chars().filter(|c| c.is_control() && *c != '\n' && *c != '\t').collect();
    assert!(bad.is_empty(), "control characters {bad:?} in output that is not a terminal:\n{output}");
}

#[test]
fn bench_local_writes_its_chart_and_prints_no_progress_codes_to_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("local.png");
    let exe = synkv();
    let mut cmd = command(&exe);
    cmd.args(["bench", "local", "--size", "1024,8192", "--iters", "3", "--warmup", "1", "--plot"]).arg(&png);
    let f = run_bounded("bench", cmd, &[]);
    assert_plain(&f.output);
    if !f.status.success() && f.output.contains("no TrueType font") {
        eprintln!("skipping the chart check: {}", f.output.trim());
        return;
    }
    assert!(f.status.success(), "{}", f.output);
    assert_eq!(f.output.matches("local size=").count(), 2, "one line per size:\n{}", f.output);
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
}

#[test]
fn launch_prints_no_progress_codes_to_a_pipe() {
    let exe = synkv();
    let mut cmd = command(&exe);
    cmd.args(["launch", "-n", "2", "-s", "1", "--"]).arg(&exe);
    cmd.args(["bench", "dist", "--size", "4096", "--iters", "2", "--warmup", "1"]);
    let f = run_bounded("launch", cmd, &[]);
    assert!(f.status.success(), "{}", f.output);
    assert_plain(&f.output);
    assert_eq!(f.output.matches("dist push+pull size=4096").count(), 2, "{}", f.output);
}

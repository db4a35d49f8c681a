//! Progress bars for long CLI work (bench iterations, `synkv launch` waiting for its peers,
//! `synkv chaos` restarting a job from its checkpoints).
//!
//! Bars are drawn on stderr only when it is a terminal, so pipes, log files, tests and CI get
//! no escape codes; `--no-progress` (bench, launch, chaos) or `SYNKV_NO_PROGRESS=1` turn them off
//! on a terminal too. A hidden bar costs nothing and can be used like a shown one, so callers
//! never branch on whether progress is on.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

static DISABLED: AtomicBool = AtomicBool::new(false);

/// Turns progress off for the rest of the process (`--no-progress`).
pub(crate) fn disable() {
    DISABLED.store(true, Ordering::Relaxed);
}

/// Whether bars are drawn: stderr is a terminal, and neither `--no-progress` nor
/// `SYNKV_NO_PROGRESS` (set to anything but empty or `0`) turned them off.
pub(crate) fn enabled() -> bool {
    let env_off = std::env::var("SYNKV_NO_PROGRESS").is_ok_and(|v| !v.is_empty() && v != "0");
    !DISABLED.load(Ordering::Relaxed) && !env_off && std::io::stderr().is_terminal()
}

fn target() -> ProgressDrawTarget {
    if enabled() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// A bar counting `len` steps, labelled `what` (e.g. the bench case).
pub(crate) fn bar(len: u64, what: &str) -> ProgressBar {
    styled(len, "{msg} [{bar:30}] {pos}/{len} {elapsed}", what)
}

/// A bar for `total` peers registering with the scheduler, ticking while it waits.
pub(crate) fn peers(total: u64) -> ProgressBar {
    let pb = styled(total, "{spinner} {msg}: {pos} of {len} {elapsed}", "waiting for the job's processes to register");
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

fn styled(len: u64, template: &str, msg: &str) -> ProgressBar {
    // cleared when dropped, so an error that ends the work early leaves no stale bar
    let pb = ProgressBar::hidden().with_finish(ProgressFinish::AndClear);
    pb.set_length(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg.to_owned());
    pb.set_draw_target(target());
    pb
}

/// The count in the scheduler's log line `registered NODE (K of N)`: `Some((K, N))`.
pub(crate) fn registered(line: &str) -> Option<(u64, u64)> {
    let rest = &line[line.find("registered ")?..];
    let inner = &rest[rest.rfind('(')? + 1..rest.rfind(')')?];
    let (k, n) = inner.split_once(" of ")?;
    Some((k.trim().parse().ok()?, n.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_schedulers_registration_lines() {
        let line = "2026-12-02T18:00:00.000Z  INFO synkv::ps::scheduler::core: registered worker 1 at 127.0.0.1:4100 (3 of 5)";
        assert_eq!(registered(line), Some((3, 5)));
        assert_eq!(registered("registered server (1 of 2)"), Some((1, 2)));
        assert_eq!(registered("refusing late registration of worker"), None);
        assert_eq!(registered("registered (x of 2)"), None);
    }

    #[test]
    fn no_bar_is_drawn_when_stderr_is_not_a_terminal_or_progress_is_off() {
        disable();
        assert!(!enabled());
        assert!(bar(10, "x").is_hidden());
    }
}

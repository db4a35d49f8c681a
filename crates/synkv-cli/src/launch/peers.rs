//! `synkv launch`'s progress bar while the job forms: how many processes have registered with
//! the scheduler, out of how many.
//!
//! The count comes from the scheduler's own log line `registered NODE (K of N)`. Only when
//! bars are on (stderr a terminal, no `--no-progress`): if `SYNKV_LOG` is unset, the scheduler
//! alone gets `SYNKV_LOG=warn,synkv::ps::scheduler=info` and the info lines that adds are
//! turned into the bar instead of printed, so what is printed stays what it was without the
//! bar. Every other line is printed with the bar hidden for a moment, so none is torn. The
//! bar is gone once every process registered (or when the job ends first).

use std::sync::Arc;

use indicatif::ProgressBar;

use super::supervise::{Part, Planned};
use super::JobSpec;

/// What the scheduler logs at `info` while the bar is on (when the user set no level).
const SCHEDULER_LOG: &str = "warn,synkv::ps::scheduler=info";

/// Sets up the bar for `plan` (its scheduler's environment, `spec`'s sink and notes); `None`
/// when bars are off.
pub(super) fn watch(plan: &mut [Planned], spec: &mut JobSpec) -> Option<ProgressBar> {
    if !crate::progress::enabled() {
        return None;
    }
    let user_log = std::env::var("SYNKV_LOG").is_ok_and(|v| !v.trim().is_empty());
    if !user_log {
        for p in plan.iter_mut().filter(|p| p.role == Part::Scheduler) {
            p.cmd.env("SYNKV_LOG", SCHEDULER_LOG);
        }
    }
    let bar = crate::progress::peers(u64::from(spec.workers + spec.servers));
    let (inner, shown) = (spec.sink.clone(), bar.clone());
    spec.sink = Arc::new(move |label: &str, to_stderr: bool, line: &[u8]| {
        if label == "scheduler" {
            let text = String::from_utf8_lossy(line);
            if let Some((k, n)) = crate::progress::registered(&text) {
                shown.set_length(n);
                shown.set_position(k);
                if k >= n {
                    shown.finish_and_clear();
                }
            }
            if !user_log && text.contains(" INFO ") {
                return; // enabled for the bar only
            }
        }
        shown.suspend(|| inner(label, to_stderr, line));
    });
    let (notes, shown) = (spec.notes.clone(), bar.clone());
    spec.notes = Arc::new(move |note: &str| shown.suspend(|| notes(note)));
    Some(bar)
}

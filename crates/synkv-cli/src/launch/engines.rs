//! `synkv launch --launcher mpi|slurm`: hand the job to Open MPI's `mpirun` or Slurm's `srun`.
//!
//! Nothing here starts a scheduler or a server: `mpirun -n W` or `srun -n W` starts `W` copies
//! of the command, and each finds its rank from the engine's variables (`OMPI_COMM_WORLD_*`,
//! `SLURM_*`); rank 0 hosts the scheduler and `SYNKV_NUM_SERVERS` processes host a server
//! (`ps::orchestrator`, docs/dist-env.md). The launcher only builds the engine's command line
//! and replaces itself with it (`exec`), so the exit status, the signals and the output are the
//! engine's own.
//!
//! - **mpi**: `mpirun -n W [--allow-run-as-root] [-x NAME=VALUE…] [-x NAME…] EXTRA… CMD…`.
//!   `--allow-run-as-root` when the launcher runs as root (Open MPI refuses root otherwise);
//!   `-x NAME=VALUE` for the settings from flags; `-x NAME` (no value: the secret never
//!   appears on a command line) for every `SYNKV_*` and `MXNET_*` variable of the launcher's
//!   environment, so processes on other hosts get them too.
//! - **slurm**: `srun -n W --export=ALL[,NAME=VALUE…] EXTRA… CMD…`; `ALL` carries the
//!   launcher's whole environment (the secret included) to every task.
//!
//! The flags become variables: `-s S` → `SYNKV_NUM_SERVERS=S` (without `-s`: one server per
//! node, the orchestrator's default), `--root-uri` → `SYNKV_ROOT_ADDR`, `--root-port` →
//! `SYNKV_ROOT_PORT`, `--replicas` → `SYNKV_SERVER_REPLICAS`. `--launcher-arg ARG` (repeated)
//! passes `ARG` to the engine before the command (`--launcher-arg=--oversubscribe`,
//! `--launcher-arg=--label`). `SYNKV_MPIRUN` / `SYNKV_SRUN` name the engine's program (default
//! `mpirun` / `srun`).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

use anyhow::{bail, Result};

use super::{launch_note, ssh, LaunchArgs, LauncherKind};

/// Variables that tell each process its own place: set for the whole job, they would give
/// every process the same rank, or (`DMLC_PS_ROOT_URI`) turn the orchestrator detection off.
const PER_PROCESS: &[&str] = &[
    "SYNKV_RANK",
    "SYNKV_WORLD_SIZE",
    "SYNKV_LOCAL_RANK",
    "SYNKV_LOCAL_WORLD_SIZE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "DMLC_PS_ROOT_URI",
    "DMLC_ROLE",
];

/// The engine's command line for `args`, given the launcher's environment `vars` and whether
/// it runs as root.
pub(crate) fn argv(args: &LaunchArgs, vars: impl IntoIterator<Item = (OsString, OsString)>, root: bool) -> Result<Vec<String>> {
    let kind = args.launcher;
    let name = match kind {
        LauncherKind::Mpi => "mpi",
        LauncherKind::Slurm => "slurm",
        LauncherKind::Local | LauncherKind::Ssh | LauncherKind::Hosted => bail!("not an engine launcher"),
    };
    if args.hostfile.is_some() || args.remote_synkv.is_some() {
        bail!("-H/--hostfile and --remote-synkv belong to the ssh launcher; with --launcher {name}, give the hosts to the engine (e.g. --launcher-arg=--hostfile --launcher-arg=FILE for mpirun, or an allocation for srun)");
    }
    if args.max_restarts > 0 {
        bail!(
            "--max-restarts: worker restarts are not supported when the processes host the scheduler and the servers (--launcher {name})"
        );
    }
    if args.grace_secs.is_some() {
        bail!("--grace-secs belongs to the local and ssh launchers; under --launcher {name} the engine ends the job");
    }
    if args.num_workers == 0 {
        bail!("-n must be at least 1");
    }
    if args.command.is_empty() {
        bail!("no worker command given");
    }
    let mut settings: Vec<(&str, String)> = Vec::new();
    if let Some(s) = args.num_servers {
        if s == 0 || s > args.num_workers {
            bail!(
                "-s {s}: with --launcher {name} the servers are hosted by the worker processes, so -s must be in 1..={}",
                args.num_workers
            );
        }
        settings.push(("SYNKV_NUM_SERVERS", s.to_string()));
    }
    if let Some(uri) = &args.root_uri {
        settings.push(("SYNKV_ROOT_ADDR", uri.clone()));
    }
    if let Some(p) = args.root_port {
        settings.push(("SYNKV_ROOT_PORT", p.to_string()));
    }
    if let Some(r) = args.replicas {
        if r > 1 {
            bail!("--replicas {r}: synkv keeps at most one backup copy of each partition; use 0 or 1");
        }
        settings.push(("SYNKV_SERVER_REPLICAS", r.to_string()));
    }
    let mut forwarded = Vec::new();
    for (k, _) in vars {
        let Some(k) = k.to_str() else { continue };
        if PER_PROCESS.contains(&k) {
            bail!("{k} is set: under --launcher {name} every process gets its rank from the engine; unset {k}");
        }
        let ours = matches!(k, "SYNKV_MPIRUN" | "SYNKV_SRUN" | "SYNKV_SSH");
        if (k.starts_with("SYNKV_") || k.starts_with("MXNET_")) && !ours && !settings.iter().any(|(n, _)| *n == k) {
            forwarded.push(k.to_owned());
        }
    }
    forwarded.sort();
    let program = |var: &str, default: &str| std::env::var(var).ok().filter(|p| !p.is_empty()).unwrap_or_else(|| default.to_owned());
    let mut out = Vec::new();
    match kind {
        LauncherKind::Mpi => {
            out.push(program("SYNKV_MPIRUN", "mpirun"));
            out.extend(["-n".to_owned(), args.num_workers.to_string()]);
            if root {
                out.push("--allow-run-as-root".to_owned());
            }
            for (k, v) in &settings {
                out.extend(["-x".to_owned(), format!("{k}={v}")]);
            }
            for k in forwarded {
                out.extend(["-x".to_owned(), k]);
            }
        }
        _ => {
            out.push(program("SYNKV_SRUN", "srun"));
            out.extend(["-n".to_owned(), args.num_workers.to_string()]);
            let mut export = "--export=ALL".to_owned();
            for (k, v) in &settings {
                if v.contains(',') {
                    bail!("{k}={v:?} contains a comma, which srun's --export cannot carry");
                }
                export.push_str(&format!(",{k}={v}"));
            }
            out.push(export);
        }
    }
    out.extend(args.launcher_args.iter().cloned());
    out.extend(args.command.iter().cloned());
    Ok(out)
}

/// Whether this process runs as root (the owner of `/proc/self` is the effective user).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// Runs (or, with `--dry-run`, prints) the engine's command; returns only on an error or after
/// a dry run.
pub(crate) fn run(args: &LaunchArgs) -> Result<u8> {
    let argv = argv(args, std::env::vars_os(), is_root())?;
    let line = ssh::join(&argv);
    if args.dry_run {
        println!("{line}");
        return Ok(0);
    }
    launch_note(&format!("running {line}"));
    let err = Command::new(&argv[0]).args(&argv[1..]).exec();
    let what = if matches!(args.launcher, LauncherKind::Mpi) {
        "Open MPI's mpirun (Debian: openmpi-bin)"
    } else {
        "Slurm's srun (Debian: slurm-client)"
    };
    bail!("could not run {:?} ({what}): {err}", argv[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: LaunchArgs,
    }

    fn argv_of(words: &[&str], vars: &[(&str, &str)], root: bool) -> Result<Vec<String>> {
        let cli = Cli::try_parse_from(std::iter::once("launch").chain(words.iter().copied())).expect("parses");
        super::argv(&cli.args, vars.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))), root)
    }

    #[test]
    fn mpi_passes_the_server_count_and_forwards_synkv_variables_by_name() {
        let got = argv_of(
            &["--launcher", "mpi", "-n", "3", "-s", "2", "--launcher-arg=--oversubscribe", "--", "train", "-x"],
            &[("SYNKV_SECRET", "s3"), ("HOME", "/root"), ("MXNET_KVSTORE_BIGARRAY_BOUND", "9"), ("SYNKV_MPIRUN", "")],
            true,
        )
        .unwrap();
        let want = "mpirun -n 3 --allow-run-as-root -x SYNKV_NUM_SERVERS=2 -x MXNET_KVSTORE_BIGARRAY_BOUND -x SYNKV_SECRET --oversubscribe train -x";
        assert_eq!(got.join(" "), want);
        let got = argv_of(&["--launcher", "mpi", "-n", "2", "--", "train"], &[], false).unwrap();
        assert_eq!(got.join(" "), "mpirun -n 2 train");
    }

    #[test]
    fn slurm_exports_all_and_the_settings() {
        let got = argv_of(
            &["--launcher", "slurm", "-n", "4", "-s", "2", "--root-port", "1234", "--replicas", "1", "--", "python", "t.py"],
            &[("SYNKV_SECRET", "s3")],
            true,
        )
        .unwrap();
        assert_eq!(got.join(" "), "srun -n 4 --export=ALL,SYNKV_NUM_SERVERS=2,SYNKV_ROOT_PORT=1234,SYNKV_SERVER_REPLICAS=1 python t.py");
    }

    #[test]
    fn refuses_what_would_give_every_process_one_rank_or_does_not_apply() {
        let e = argv_of(&["--launcher", "mpi", "-n", "2", "--", "t"], &[("SYNKV_RANK", "0")], false).unwrap_err();
        assert!(e.to_string().contains("unset SYNKV_RANK"), "{e}");
        let e = argv_of(&["--launcher", "slurm", "-n", "2", "--", "t"], &[("DMLC_PS_ROOT_URI", "h")], false).unwrap_err();
        assert!(e.to_string().contains("unset DMLC_PS_ROOT_URI"), "{e}");
        let e = argv_of(&["--launcher", "slurm", "-n", "2", "-s", "3", "--", "t"], &[], false).unwrap_err();
        assert!(e.to_string().contains("1..=2"), "{e}");
        let e = argv_of(&["--launcher", "mpi", "-n", "2", "--max-restarts", "1", "--", "t"], &[], false).unwrap_err();
        assert!(e.to_string().contains("--max-restarts"), "{e}");
    }
}

//! `synkv launch --launcher ssh -H hostfile` through a fake `ssh` (`SYNKV_SSH`): a shell script
//! that records its arguments and runs the remote command on this host in an empty
//! environment (as a fresh login would), so every variable a process sees came through the
//! command line or, for the secret, ssh's standard input. Hosts are 127.0.0.1 and localhost.

use std::path::{Path, PathBuf};

use crate::util::{command, run_bounded, synkv, synkv_command, Finished};

/// Records `dest port=P remote-command` in `$FAKE_SSH_LOG`, then runs the command with `sh -c`.
const FAKE_SSH: &str = r#"#!/bin/sh
port=22
while [ $# -gt 0 ]; do
    case "$1" in
        -o) shift 2 ;;
        -p) port=$2; shift 2 ;;
        -*) echo "fake ssh: unexpected option $1" >&2; exit 255 ;;
        *) break ;;
    esac
done
dest=$1
shift
printf '%s port=%s %s\n' "$dest" "$port" "$*" >> "$FAKE_SSH_LOG"
exec env -i PATH="$PATH" HOME="$HOME" sh -c "$*"
"#;

const SECRET: &str = "fake-ssh-secret-7f3a";

/// A fresh folder with the fake ssh, a hostfile holding `hosts`, and the log path.
struct Setup {
    dir: PathBuf,
}

impl Setup {
    fn new(name: &str, hosts: &str) -> Setup {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("launch-ssh-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ssh = dir.join("fake-ssh");
        std::fs::write(&ssh, FAKE_SSH).expect("writing the fake ssh");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        std::fs::write(dir.join("hosts"), hosts).expect("writing the hostfile");
        Setup { dir }
    }

    /// `synkv launch --launcher ssh -H hosts -n W -s S [extra…] -- command…`.
    fn launch(&self, workers: u32, servers: u32, extra: &[&str], command: &[&str]) -> Finished {
        let mut cmd = synkv_command();
        cmd.args(["launch", "--launcher", "ssh", "-H"]).arg(self.dir.join("hosts"));
        cmd.args(["-n", &workers.to_string(), "-s", &servers.to_string()]).args(extra).arg("--").args(command);
        cmd.current_dir(&self.dir);
        let ssh = self.dir.join("fake-ssh");
        let log = self.dir.join("ssh.log");
        let (ssh, log) = (ssh.to_string_lossy(), log.to_string_lossy());
        run_bounded("launch", cmd, &[("SYNKV_SSH", &ssh), ("FAKE_SSH_LOG", &log), ("SYNKV_SECRET", SECRET)])
    }

    /// The fake ssh's log: one line per ssh call.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("ssh.log")).unwrap_or_default()
    }
}

/// The log line of the process with `role` and `task`.
fn call_of<'a>(log: &'a str, role: &str, task: u32) -> &'a str {
    let (r, t) = (format!("DMLC_ROLE={role} "), format!(" DMLC_TASK_ID={task} "));
    let calls: Vec<&str> = log.lines().filter(|l| l.contains(&r) && l.contains(&t)).collect();
    assert_eq!(calls.len(), 1, "one ssh call for {role} {task} expected in:\n{log}");
    calls[0]
}

/// The words `sh` reads from `line` (a trailing `# comment` is dropped).
fn shell_words(line: &str) -> Vec<String> {
    let out = command("sh").arg("-c").arg(format!("printf '%s\\0' {line}")).output().expect("running sh");
    assert!(out.status.success(), "sh cannot read {line:?}");
    String::from_utf8_lossy(&out.stdout).split_terminator('\0').map(str::to_owned).collect()
}

#[test]
fn a_two_by_two_job_runs_through_ssh_round_robin() {
    let s = Setup::new("job", "# two hosts\n\n127.0.0.1\nuser@localhost:2222   # the second\n");
    let exe = synkv();
    let f = s.launch(2, 2, &[], &[&exe.to_string_lossy(), "selftest", "dist", "t24", "--repeat", "2"]);
    let log = s.log();
    assert!(f.status.success(), "{}\nssh log:\n{log}", f.output);
    for w in 0..2 {
        assert!(f.output.contains(&format!("[worker {w}] selftest t24 ok (rank {w} of 2 workers, 2 servers)")), "{}", f.output);
    }
    for label in ["scheduler", "server 0", "server 1", "worker 0", "worker 1"] {
        assert!(f.output.contains(&format!("[launch] {label} exited successfully")), "{label}: {}", f.output);
    }
    assert!(f.output.contains("[launch] started scheduler on this host (pid "), "{}", f.output);
    assert!(f.output.contains("[launch] started server 1 on user@localhost (port 2222) via ssh (pid "), "{}", f.output);
    // Round robin: index i of each role on host i mod 2; the scheduler is not started by ssh.
    assert_eq!(log.lines().count(), 4, "{log}");
    for (role, task, host, port) in [
        ("server", 0, "127.0.0.1", 22),
        ("server", 1, "user@localhost", 2222),
        ("worker", 0, "127.0.0.1", 22),
        ("worker", 1, "user@localhost", 2222),
    ] {
        let call = call_of(&log, role, task);
        assert!(call.starts_with(&format!("{host} port={port} cd ")), "{role} {task}: {call}");
        let node = host.rsplit('@').next().unwrap_or(host);
        assert!(call.contains(&format!(" DMLC_NODE_HOST={node} ")), "{call}");
        assert!(call.contains(" DMLC_PS_ROOT_URI=127.0.0.1 ") && call.contains(" SYNKV_HEARTBEAT_TIMEOUT_MS=2000 "), "{call}");
    }
    // The secret reached every remote process (authentication succeeded) but never a command
    // line or the output.
    assert!(log.contains("IFS= read -r SYNKV_SECRET && export SYNKV_SECRET"), "{log}");
    assert!(!log.contains(SECRET) && !f.output.contains(SECRET), "the secret leaked:\n{log}\n{}", f.output);
}

#[test]
fn a_failing_worker_fails_the_ssh_job_and_the_rest_are_killed() {
    let s = Setup::new("fail", "localhost\n127.0.0.1\n");
    let script = r#"if [ "$DMLC_TASK_ID" = 1 ]; then echo "worker 1 on $DMLC_NODE_HOST fails"; exit 3; fi; exec sleep 120"#;
    let started = std::time::Instant::now();
    let f = s.launch(2, 1, &["--grace-secs", "1"], &["sh", "-c", script]);
    assert_eq!(f.status.code(), Some(3), "{}", f.output);
    assert!(f.output.contains("[worker 1] worker 1 on 127.0.0.1 fails"), "{}", f.output);
    assert!(f.output.contains("[launch] worker 1 exited with status 3"), "{}", f.output);
    for label in ["scheduler", "server 0", "worker 0"] {
        assert!(f.output.contains(&format!("[launch] killing {label} (still running after the grace period)")), "{}", f.output);
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "the sleeping worker was not stopped");
}

#[test]
fn dry_run_prints_quoted_commands_without_the_secret() {
    let s = Setup::new("dry", "node-a\nbob@node-b:2200\n");
    let f = s.launch(1, 2, &["--dry-run", "--root-uri", "127.0.0.1", "--root-port", "9123"], &["./train", "it's", "a b"]);
    assert!(f.status.success(), "{}", f.output);
    assert!(s.log().is_empty(), "a dry run started ssh");
    let line = |label: &str| f.output.lines().find(|l| l.starts_with(&format!("[{label}] "))).unwrap_or_default().to_owned();
    let sched = line("scheduler");
    assert!(sched.contains("DMLC_ROLE=scheduler") && sched.contains("DMLC_PS_ROOT_PORT=9123") && sched.ends_with(" scheduler"), "{sched}");
    let server1 = line("server 1");
    assert!(server1.contains("fake-ssh -o StrictHostKeyChecking=accept-new -p 2200 bob@node-b 'cd "), "{server1}");
    assert!(server1.contains("DMLC_NODE_HOST=node-b") && server1.ends_with("# SYNKV_SECRET on standard input (redacted)"), "{server1}");
    // The printed line is valid shell: its last word is the remote command, itself quoted.
    let worker = line("worker 0");
    let words = shell_words(worker.trim_start_matches("[worker 0] "));
    let ssh = s.dir.join("fake-ssh").display().to_string();
    assert_eq!(words[..4], [ssh.as_str(), "-o", "StrictHostKeyChecking=accept-new", "node-a"], "{worker}");
    assert_eq!(words.len(), 5, "{worker}");
    let remote = words.last().expect("a remote command");
    assert!(remote.starts_with("cd ") && remote.ends_with(r" ./train 'it'\''s' 'a b'"), "{remote}");
    assert!(!f.output.contains(SECRET), "{}", f.output);
}

#[test]
fn bad_hostfiles_and_options_are_refused_clearly() {
    let s = Setup::new("bad", "node1\nnode2 slots=4\n");
    let f = s.launch(1, 1, &[], &["true"]);
    assert!(!f.status.success());
    assert!(f.output.contains("line 2: \"node2 slots=4\" has more than one field; write one host per line"), "{}", f.output);

    let mut cmd = synkv_command();
    cmd.args(["launch", "-n", "1", "--launcher", "ssh", "--", "true"]);
    let f = run_bounded("launch", cmd, &[]);
    assert!(!f.status.success() && f.output.contains("--launcher ssh needs a hostfile: -H FILE"), "{}", f.output);

    let mut cmd = synkv_command();
    cmd.args(["launch", "-n", "1", "-H", "hosts.txt", "--", "true"]);
    let f = run_bounded("launch", cmd, &[]);
    assert!(!f.status.success() && f.output.contains("add --launcher ssh"), "{}", f.output);

    // The scheduler runs here, so its address must be this host's (192.0.2.1 is TEST-NET-1).
    std::fs::write(s.dir.join("hosts"), "node1\n").expect("hostfile");
    let f = s.launch(1, 1, &["--root-uri", "192.0.2.1"], &["true"]);
    assert!(!f.status.success() && f.output.contains("must be one of this host's addresses"), "{}", f.output);
}

//! The ssh launcher (`--launcher ssh -H hostfile`): MXNet's `tools/launch.py --launcher ssh`.
//!
//! **Placement.** The scheduler runs on *this* host, as in MXNet, and binds
//! `DMLC_PS_ROOT_URI` — so that address must be one of this host's and reachable from every
//! host. It is `--root-uri`, else `DMLC_PS_ROOT_URI` from the environment, else `127.0.0.1`
//! when every host is a loopback name, else this host's address on the route to the first
//! remote host. The port is `--root-port`, else `DMLC_PS_ROOT_PORT`, else a free one. Server
//! `i` runs on host `i mod H` and worker `i` on host `i mod H` (each role is spread evenly,
//! starting from the first host), each with `DMLC_NODE_HOST` set to its host's name as the
//! hostfile writes it (so that name must resolve to that host from every other host).
//!
//! **Remote command.** Each is started as
//! `$SYNKV_SSH -o StrictHostKeyChecking=accept-new [-p port] [user@]host 'cd CWD && exec env VAR=… CMD ARGS'`
//! (`SYNKV_SSH` defaults to `ssh`; tests substitute a script). Host keys are checked: a known
//! host whose key changed is refused (the secret is sent only to hosts that prove the key
//! they had before); a host seen for the first time is added, as `accept-new` does.
//! `SYNKV_SSH_HOST_KEY_CHECKING` picks another value (`yes`, `ask`) or `config` (no option:
//! the user's ssh configuration decides); `no` is refused. Every word is shell-quoted with
//! [`quote`], for the remote user's login shell, which must be POSIX-like (sh, dash, bash,
//! zsh; not csh or fish). CWD is the launcher's directory, which must exist on every host
//! (a shared file system, as MXNet assumes without `--sync-dst-dir`); servers run
//! `--remote-synkv` (default: the path of this `synkv`) `server`.
//!
//! **Environment.** The remote side gets the `DMLC_*` variables of its role and, from the
//! launcher's environment, every `SYNKV_*` variable except `SYNKV_SSH`, every `MXNET_*`
//! variable, and `OMP_NUM_THREADS`, `LD_LIBRARY_PATH`, `RUST_LOG`, `RUST_BACKTRACE` when set.
//! `SYNKV_SECRET` is the exception: it never appears on a command line (where `ps` on either
//! host would show it) nor in the launcher's output. The remote command starts with
//! `IFS= read -r SYNKV_SECRET && export SYNKV_SECRET`, and the launcher writes the secret and a
//! newline to ssh's standard input, then closes it.
//!
//! **Stopping.** The launcher can only kill the local `ssh` processes. Without a terminal
//! (`ssh` without `-tt`, as here and in MXNet), sshd sends the remote command no signal when
//! the connection closes: it dies of SIGPIPE on its next write to stdout or stderr, and a quiet
//! one keeps running (checked against OpenSSH's sshd on 127.0.0.1: a remote `sleep` outlives
//! its killed `ssh`). synkv's own processes do not, because the scheduler runs here and is
//! killed with the job: every server, and every worker using a dist store, sees its connection
//! to the scheduler close and exits (with the same sshd: none left a second after the
//! launcher exited, with a 30 s heartbeat timeout), or after `SYNKV_HEARTBEAT_TIMEOUT_MS` if
//! the close never arrives. `ssh -tt` makes sshd hang up the remote terminal, so SIGHUP kills
//! the remote command at once (checked too); it is not used because a terminal merges the
//! remote stderr into stdout (losing the stdout/stderr split of the prefixed output), turns
//! `\n` into `\r\n`, and echoes input — the secret written on stdin would be printed.

use std::borrow::Cow;
use std::ffi::OsString;
use std::net::{IpAddr, ToSocketAddrs, UdpSocket};
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::hostfile::Host;
use super::supervise::{Part, Planned};

/// Variables forwarded by name, besides `SYNKV_*` and `MXNET_*`.
const FORWARDED: [&str; 4] = ["OMP_NUM_THREADS", "LD_LIBRARY_PATH", "RUST_LOG", "RUST_BACKTRACE"];

/// `s` as one word of a POSIX shell command: unchanged when it is made only of characters no
/// shell treats specially, otherwise in single quotes (a `'` inside becomes `'\''`).
pub(crate) fn quote(s: &str) -> Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | ',' | ':' | '+' | '@' | '%' | '=');
    // A leading '=' or a word that is all '=' is still plain to the shell; '~' and '#' are not.
    if !s.is_empty() && s.chars().all(plain) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(format!("'{}'", s.replace('\'', r"'\''")))
    }
}

/// The words of `argv` quoted and joined with spaces.
pub(crate) fn join(argv: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    argv.into_iter().map(|a| quote(a.as_ref()).into_owned()).collect::<Vec<_>>().join(" ")
}

/// Variables as (name, value) pairs.
pub(crate) type EnvVars = Vec<(String, String)>;

/// The variables of `vars` that the remote processes get (see the module docs), sorted, and
/// the secret apart. A forwarded variable that is not UTF-8 is an error.
pub(crate) fn forwarded_env(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Result<(EnvVars, Option<String>)> {
    let mut out = Vec::new();
    let mut secret = None;
    for (k, v) in vars {
        let Some(k) = k.to_str() else { continue };
        let wanted = (k.starts_with("SYNKV_") && k != "SYNKV_SSH") || k.starts_with("MXNET_") || FORWARDED.contains(&k);
        if !wanted {
            continue;
        }
        let Some(v) = v.to_str() else {
            bail!("environment variable {k} is not valid UTF-8, so it cannot be forwarded over ssh; fix or unset it");
        };
        if k == "SYNKV_SECRET" {
            if v.contains(['\n', '\r', '\0']) {
                bail!("SYNKV_SECRET contains a line break; the ssh launcher sends it as one line, so use a secret without one");
            }
            secret = Some(v.to_owned());
        } else {
            out.push((k.to_owned(), v.to_owned()));
        }
    }
    out.sort();
    Ok((out, secret))
}

/// The command line a remote shell runs: `cd CWD && [read the secret &&] exec env VARS CMD…`.
pub(crate) fn remote_command(cwd: &str, env: &[(String, String)], reads_secret: bool, argv: &[String]) -> String {
    let mut s = format!("cd {} && ", quote(cwd));
    if reads_secret {
        s.push_str("IFS= read -r SYNKV_SECRET && export SYNKV_SECRET && ");
    }
    s.push_str("exec env ");
    for (k, v) in env {
        s.push_str(&quote(&format!("{k}={v}")));
        s.push(' ');
    }
    s.push_str(&join(argv));
    s
}

/// The `StrictHostKeyChecking` value the launcher passes to ssh, from
/// `SYNKV_SSH_HOST_KEY_CHECKING` (`None`: pass none, the user's ssh configuration decides).
pub(crate) fn host_key_checking(from_env: Option<&str>) -> Result<Option<String>> {
    match from_env.map(str::trim) {
        None | Some("") => Ok(Some("accept-new".to_owned())),
        Some("config") => Ok(None),
        Some(v @ ("yes" | "accept-new" | "ask")) => Ok(Some(v.to_owned())),
        Some(v) if v.eq_ignore_ascii_case("no") || v.eq_ignore_ascii_case("off") => bail!(
            "SYNKV_SSH_HOST_KEY_CHECKING={v}: the launcher sends the job's secret over these connections, so it does not turn host-key checking off; use accept-new (the default), yes, ask, or config"
        ),
        Some(v) => bail!("SYNKV_SSH_HOST_KEY_CHECKING={v:?} is not one of accept-new (the default), yes, ask, config"),
    }
}

/// ssh's arguments for running `remote` on `host`, checking host keys as `checking` says.
pub(crate) fn ssh_args(host: &Host, checking: Option<&str>, remote: String) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(c) = checking {
        args.extend(["-o".to_owned(), format!("StrictHostKeyChecking={c}")]);
    }
    if let Some(p) = host.port {
        args.extend(["-p".to_owned(), p.to_string()]);
    }
    args.push(host.destination());
    args.push(remote);
    args
}

/// The scheduler's address (see the module docs for the order of choices).
pub(crate) fn root_uri(flag: Option<&str>, from_env: Option<String>, hosts: &[Host]) -> Result<String> {
    if let Some(uri) = flag.map(str::to_owned).or(from_env).map(|u| u.trim().to_owned()) {
        if uri.is_empty() || uri.contains(char::is_whitespace) {
            bail!("the scheduler address {uri:?} (--root-uri or DMLC_PS_ROOT_URI) is not a host name or IP address");
        }
        return Ok(uri);
    }
    let Some(remote) = hosts.iter().find(|h| !h.is_loopback()) else { return Ok("127.0.0.1".to_owned()) };
    route_address(remote).with_context(|| {
        format!("finding this host's address as seen from {}; give the scheduler's address with --root-uri ADDRESS", remote.host)
    })
}

/// This host's address on the route to `host` (a UDP "connect" sends nothing).
fn route_address(host: &Host) -> Result<String> {
    let target = (host.host.as_str(), host.port.unwrap_or(22)).to_socket_addrs()?.next().context("the host name resolves to no address")?;
    let any: IpAddr = if target.is_ipv6() { "::".parse()? } else { "0.0.0.0".parse()? };
    let socket = UdpSocket::bind((any, 0))?;
    socket.connect(target)?;
    let ip = socket.local_addr()?.ip();
    if ip.is_unspecified() {
        bail!("no route to {target}");
    }
    Ok(ip.to_string())
}

/// Where the ssh launcher runs each process, and how.
pub(crate) struct SshJob<'a> {
    pub(crate) hosts: &'a [Host],
    /// The ssh program (`SYNKV_SSH`).
    pub(crate) ssh: OsString,
    /// This `synkv`, for the local scheduler.
    pub(crate) local_synkv: &'a Path,
    /// The `synkv` that remote servers run.
    pub(crate) remote_synkv: String,
    pub(crate) cwd: String,
    pub(crate) root_uri: String,
    pub(crate) root_port: u16,
    pub(crate) servers: u32,
    pub(crate) workers: u32,
    /// The worker program and its arguments.
    pub(crate) command: &'a [String],
    /// Forwarded variables, without the secret.
    pub(crate) env: EnvVars,
    pub(crate) secret: Option<String>,
    /// ssh's `StrictHostKeyChecking` (see [`host_key_checking`]).
    pub(crate) host_key_checking: Option<String>,
}

impl SshJob<'_> {
    /// Every process to start: the local scheduler, then the servers and workers over ssh.
    pub(crate) fn plan(&self) -> Vec<Planned> {
        let counts = [("DMLC_NUM_SERVER", self.servers.to_string()), ("DMLC_NUM_WORKER", self.workers.to_string())];
        let root = [("DMLC_PS_ROOT_URI", self.root_uri.clone()), ("DMLC_PS_ROOT_PORT", self.root_port.to_string())];
        let mut scheduler = Command::new(self.local_synkv);
        scheduler.arg("scheduler").env("DMLC_ROLE", "scheduler").envs(root.clone()).envs(counts.clone());
        scheduler.env("DMLC_JOB_CLUSTER", "ssh").env_remove("DMLC_TASK_ID");
        let mut plan =
            vec![Planned { label: "scheduler".into(), role: Part::Scheduler, cmd: scheduler, stdin: None, place: " on this host".into() }];
        let roles = (0..self.servers).map(|i| ("server", i)).chain((0..self.workers).map(|i| ("worker", i)));
        let parts = self.cross_host_parts();
        for (role, i) in roles {
            let host = &self.hosts[i as usize % self.hosts.len()];
            let mut env: Vec<(String, String)> = [("DMLC_ROLE", role.to_owned())]
                .into_iter()
                .chain(root.clone())
                .chain(counts.clone())
                .chain([("DMLC_TASK_ID", i.to_string()), ("DMLC_NODE_HOST", host.host.clone()), ("DMLC_JOB_CLUSTER", "ssh".into())])
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            env.extend(self.env.iter().cloned());
            env.extend(parts.clone());
            let argv: Vec<String> = if role == "server" { vec![self.remote_synkv.clone(), "server".into()] } else { self.command.to_vec() };
            let remote = remote_command(&self.cwd, &env, self.secret.is_some(), &argv);
            let mut cmd = Command::new(&self.ssh);
            cmd.args(ssh_args(host, self.host_key_checking.as_deref(), remote));
            let stdin = self.secret.as_ref().map(|s| format!("{s}\n").into_bytes());
            let part = if role == "server" { Part::Server } else { Part::Worker };
            plan.push(Planned { label: format!("{role} {i}"), role: part, cmd, stdin, place: format!(" on {host} via ssh") });
        }
        plan
    }

    /// `SYNKV_PARTITION_BYTES` for every process when the job spans more than one host and
    /// the caller set neither it nor `SYNKV_MAX_FRAME_BYTES` (which caps it): parts small
    /// enough to pipeline over a network (`ps::config::CROSS_HOST_PARTITION_BYTES`).
    fn cross_host_parts(&self) -> Option<(String, String)> {
        // Servers and workers are each placed round-robin from the first host.
        let used = usize::try_from(self.servers.max(self.workers)).unwrap_or(usize::MAX).min(self.hosts.len());
        let hosts: std::collections::HashSet<&str> = self.hosts[..used].iter().map(|h| h.host.as_str()).collect();
        let set = |name: &str| self.env.iter().any(|(k, _)| k == name);
        (hosts.len() > 1 && !set("SYNKV_PARTITION_BYTES") && !set("SYNKV_MAX_FRAME_BYTES"))
            .then(|| ("SYNKV_PARTITION_BYTES".to_owned(), synkv::ps::config::CROSS_HOST_PARTITION_BYTES.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `sh` makes of `line`: its words, one per output line (NUL-separated).
    fn sh_words(line: &str) -> Vec<String> {
        let out = Command::new("sh").arg("-c").arg(format!("printf '%s\\0' {line}")).output().expect("running sh");
        assert!(out.status.success(), "sh failed on {line:?}");
        let text = String::from_utf8(out.stdout).expect("utf-8");
        text.split_terminator('\0').map(str::to_owned).collect()
    }

    #[test]
    fn quoting_survives_a_real_shell() {
        let words = [
            "plain",
            "",
            "two words",
            "it's",
            "''",
            "$HOME",
            "`id`",
            "$(id)",
            "a;b&&c|d",
            "back\\slash",
            "new\nline",
            "tab\there",
            "*",
            "~",
            "#hash",
            "=",
            "x=1",
            "--flag=a b",
            "é ü",
            "\"dq\"",
            "!bang",
            "{a,b}",
        ];
        let line = join(words);
        assert_eq!(sh_words(&line), words);
        assert_eq!(quote("plain/path-1.0"), "plain/path-1.0");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn the_remote_command_runs_in_cwd_with_its_variables() {
        let env = vec![("DMLC_ROLE".to_owned(), "worker".to_owned()), ("SYNKV_X".to_owned(), "a 'b' $c".to_owned())];
        let argv =
            vec!["sh".to_owned(), "-c".to_owned(), r#"printf '%s|%s|%s|%s\n' "$DMLC_ROLE" "$SYNKV_X" "$SYNKV_SECRET" "$(pwd)""#.to_owned()];
        let cmd = remote_command("/", &env, true, &argv);
        assert!(cmd.starts_with("cd / && IFS= read -r SYNKV_SECRET && export SYNKV_SECRET && exec env DMLC_ROLE=worker "), "{cmd}");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .env_clear()
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), b" s3 cr\\et \n").expect("write");
        let out = child.wait_with_output().expect("wait");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "worker|a 'b' $c| s3 cr\\et |/\n");
    }

    #[test]
    fn only_the_documented_variables_are_forwarded_and_the_secret_apart() {
        let vars = [
            ("SYNKV_TIMEOUT_MS", "5"),
            ("SYNKV_SSH", "/bin/fake"),
            ("SYNKV_SECRET", "hush"),
            ("MXNET_KVSTORE_BIGARRAY_BOUND", "9"),
            ("OMP_NUM_THREADS", "2"),
            ("HOME", "/root"),
            ("DMLC_ROLE", "worker"),
            ("PATH", "/bin"),
        ];
        let (env, secret) = forwarded_env(vars.map(|(k, v)| (k.into(), v.into()))).unwrap();
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["MXNET_KVSTORE_BIGARRAY_BOUND", "OMP_NUM_THREADS", "SYNKV_TIMEOUT_MS"]);
        assert_eq!(secret.as_deref(), Some("hush"));
        let e = forwarded_env([("SYNKV_SECRET".into(), "a\nb".into())]).unwrap_err();
        assert!(e.to_string().contains("line break") && !e.to_string().contains("a\nb"), "{e}");
    }

    #[test]
    fn host_keys_are_checked_unless_the_user_configures_it_and_never_turned_off() {
        assert_eq!(host_key_checking(None).unwrap().as_deref(), Some("accept-new"));
        assert_eq!(host_key_checking(Some("yes")).unwrap().as_deref(), Some("yes"));
        assert_eq!(host_key_checking(Some("config")).unwrap(), None);
        for off in ["no", "off", "NO"] {
            let e = host_key_checking(Some(off)).unwrap_err().to_string();
            assert!(e.contains("does not turn host-key checking off"), "{e}");
        }
        assert!(host_key_checking(Some("maybe")).is_err());
        let host = Host { user: None, host: "n0".into(), port: None };
        assert_eq!(ssh_args(&host, None, "true".into()), ["n0", "true"]);
    }

    #[test]
    fn ssh_arguments_and_round_robin_placement() {
        let hosts = super::super::hostfile::parse("h", "n0\nbob@n1:2222\n").unwrap();
        let exe = Path::new("/opt/synkv");
        let cmd = vec!["./train".to_owned(), "--lr".to_owned(), "0.1 x".to_owned()];
        let job = SshJob {
            hosts: &hosts,
            ssh: "ssh".into(),
            local_synkv: exe,
            remote_synkv: "/opt/synkv".into(),
            cwd: "/work dir".into(),
            root_uri: "10.0.0.9".into(),
            root_port: 9000,
            servers: 3,
            workers: 2,
            command: &cmd,
            env: vec![("SYNKV_TIMEOUT_MS".into(), "5".into())],
            secret: Some("hush".into()),
            host_key_checking: Some("accept-new".into()),
        };
        let plan = job.plan();
        let labels: Vec<&str> = plan.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(labels, ["scheduler", "server 0", "server 1", "server 2", "worker 0", "worker 1"]);
        let places: Vec<&str> = plan.iter().map(|p| p.place.as_str()).collect();
        assert_eq!(
            places,
            [
                " on this host",
                " on n0 via ssh",
                " on bob@n1 (port 2222) via ssh",
                " on n0 via ssh",
                " on n0 via ssh",
                " on bob@n1 (port 2222) via ssh"
            ]
        );
        let args: Vec<String> = plan[2].cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(&args[..5], ["-o", "StrictHostKeyChecking=accept-new", "-p", "2222", "bob@n1"]);
        assert_eq!(
            args[5],
            "cd '/work dir' && IFS= read -r SYNKV_SECRET && export SYNKV_SECRET && exec env DMLC_ROLE=server \
             DMLC_PS_ROOT_URI=10.0.0.9 DMLC_PS_ROOT_PORT=9000 DMLC_NUM_SERVER=3 DMLC_NUM_WORKER=2 DMLC_TASK_ID=1 \
             DMLC_NODE_HOST=n1 DMLC_JOB_CLUSTER=ssh SYNKV_TIMEOUT_MS=5 SYNKV_PARTITION_BYTES=1048576 /opt/synkv server"
        );
        let worker: Vec<String> = plan[5].cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(worker[5].ends_with(
            "DMLC_TASK_ID=1 DMLC_NODE_HOST=n1 DMLC_JOB_CLUSTER=ssh SYNKV_TIMEOUT_MS=5 SYNKV_PARTITION_BYTES=1048576 ./train --lr '0.1 x'"
        ));
        for p in &plan {
            let shown = format!("{:?}", p.cmd);
            assert!(!shown.contains("hush"), "the secret is on a command line: {shown}");
        }
        assert_eq!(plan[1].stdin.as_deref(), Some(&b"hush\n"[..]));
        assert!(plan[0].stdin.is_none());
    }

    /// A job over several hosts gets parts that pipeline over a network, unless the caller
    /// chose the size (or the frame limit that caps it); a job on one host keeps synkv's default.
    #[test]
    fn a_job_over_several_hosts_gets_network_sized_parts() {
        let parts_of = |hostfile: &str, servers: u32, workers: u32, env: &[(&str, &str)]| {
            let hosts = super::super::hostfile::parse("h", hostfile).unwrap();
            let job = SshJob {
                hosts: &hosts,
                ssh: "ssh".into(),
                local_synkv: Path::new("/opt/synkv"),
                remote_synkv: "/opt/synkv".into(),
                cwd: "/".into(),
                root_uri: "10.0.0.9".into(),
                root_port: 9000,
                servers,
                workers,
                command: &[],
                env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
                secret: None,
                host_key_checking: None,
            };
            job.cross_host_parts().map(|(_, v)| v)
        };
        assert_eq!(parts_of("n0\nn1\n", 2, 2, &[]).as_deref(), Some("1048576"));
        assert_eq!(parts_of("n0\nn1\n", 1, 2, &[]).as_deref(), Some("1048576"), "the second worker is on n1");
        assert_eq!(parts_of("n0\nn1\n", 1, 1, &[]), None, "only n0 is used");
        assert_eq!(parts_of("n0\nalice@n0:2222\n", 2, 2, &[]), None, "one host, two logins");
        assert_eq!(parts_of("n0\nn1\n", 2, 2, &[("SYNKV_PARTITION_BYTES", "4194304")]), None);
        assert_eq!(parts_of("n0\nn1\n", 2, 2, &[("SYNKV_MAX_FRAME_BYTES", "1048576")]), None);
    }

    #[test]
    fn the_root_uri_comes_from_the_flag_the_environment_or_the_hosts() {
        let local = super::super::hostfile::parse("h", "localhost\n127.0.0.1\n").unwrap();
        assert_eq!(root_uri(Some("10.1.1.1"), Some("10.2.2.2".into()), &local).unwrap(), "10.1.1.1");
        assert_eq!(root_uri(None, Some("10.2.2.2".into()), &local).unwrap(), "10.2.2.2");
        assert_eq!(root_uri(None, None, &local).unwrap(), "127.0.0.1");
        assert!(root_uri(Some("a b"), None, &local).unwrap_err().to_string().contains("not a host name"));
        let unresolvable = super::super::hostfile::parse("h", "no-such-host.invalid\n").unwrap();
        let e = root_uri(None, None, &unresolvable).unwrap_err();
        assert!(format!("{e:#}").contains("--root-uri"), "{e:#}");
    }
}

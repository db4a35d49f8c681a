//! The ssh launcher's hostfile: one host per line, `[user@]host[:port]`.
//!
//! Blank lines and everything after a `#` are ignored. `host` is a host name or an IPv4
//! address; an IPv6 address is written in brackets (`[fe80::1]`, `[::1]:2222`) or bare without
//! a port (`::1`). A host may be listed more than once (it then gets more processes). Anything
//! else — extra fields such as mpirun's `slots=4`, a bad port, a character a host name cannot
//! contain, a leading `-` that ssh would read as an option — is a [`HostfileError`] naming the
//! file, the line and what to write instead. Parsing only: nothing is resolved or contacted.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// One hostfile entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Host {
    /// The login name (`user@`), if given.
    pub(crate) user: Option<String>,
    /// Host name or address, without brackets.
    pub(crate) host: String,
    /// ssh port (`:port`), if given.
    pub(crate) port: Option<u16>,
}

impl Host {
    /// ssh's destination argument: `host` or `user@host`.
    pub(crate) fn destination(&self) -> String {
        match &self.user {
            Some(u) => format!("{u}@{}", self.host),
            None => self.host.clone(),
        }
    }

    /// Whether this is this machine's loopback (`localhost`, `127.x.x.x`, `::1`).
    pub(crate) fn is_loopback(&self) -> bool {
        self.host.eq_ignore_ascii_case("localhost")
            || self.host.parse::<Ipv4Addr>().is_ok_and(|a| a.is_loopback())
            || self.host.parse::<Ipv6Addr>().is_ok_and(|a| a.is_loopback())
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.destination())?;
        if let Some(p) = self.port {
            write!(f, " (port {p})")?;
        }
        Ok(())
    }
}

/// A hostfile that cannot be used.
#[derive(Debug)]
pub(crate) struct HostfileError {
    /// The file, as given.
    pub(crate) path: String,
    /// 1-based line number, `None` for the whole file.
    pub(crate) line: Option<usize>,
    pub(crate) problem: String,
}

impl fmt::Display for HostfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(n) => write!(f, "hostfile {}, line {n}: {}", self.path, self.problem),
            None => write!(f, "hostfile {}: {}", self.path, self.problem),
        }
    }
}

impl std::error::Error for HostfileError {}

const FORM: &str = "write one host per line as host, user@host, host:port or [ipv6]:port";

/// Reads and parses the hostfile at `path`.
pub(crate) fn read(path: &Path) -> Result<Vec<Host>, HostfileError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| HostfileError {
        path: name.clone(),
        line: None,
        problem: format!("cannot be read: {e}"),
    })?;
    parse(&name, &text)
}

/// Parses hostfile `text` (`path` is only used in errors).
pub(crate) fn parse(path: &str, text: &str) -> Result<Vec<Host>, HostfileError> {
    let mut hosts = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let entry = raw.split('#').next().unwrap_or("").trim();
        if entry.is_empty() {
            continue;
        }
        let fail = |problem: String| HostfileError { path: path.to_owned(), line: Some(i + 1), problem };
        if entry.split_whitespace().count() > 1 {
            return Err(fail(format!("{entry:?} has more than one field; {FORM} (nothing else on the line)")));
        }
        hosts.push(parse_entry(entry).map_err(|p| fail(format!("{entry:?}: {p}; {FORM}")))?);
    }
    if hosts.is_empty() {
        return Err(HostfileError { path: path.to_owned(), line: None, problem: format!("lists no hosts; {FORM}") });
    }
    Ok(hosts)
}

fn parse_entry(entry: &str) -> Result<Host, String> {
    let (user, rest) = match entry.rsplit_once('@') {
        Some((u, r)) => {
            if u.is_empty() || !u.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) || u.starts_with('-') {
                return Err(format!("{u:?} is not a user name (letters, digits, '.', '_', '-')"));
            }
            (Some(u.to_owned()), r)
        }
        None => (None, entry),
    };
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let (addr, after) = inner.split_once(']').ok_or("an opening '[' without a closing ']'")?;
        addr.parse::<Ipv6Addr>().map_err(|_| format!("{addr:?} in brackets is not an IPv6 address"))?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(format!("unexpected {p:?} after ']'"))?),
        };
        (addr.to_owned(), port)
    } else if rest.matches(':').count() > 1 {
        rest.parse::<Ipv6Addr>().map_err(|_| format!("{rest:?} is not an IPv6 address (write [address]:port for a port)"))?;
        (rest.to_owned(), None)
    } else {
        match rest.split_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (rest.to_owned(), None),
        }
    };
    if host.is_empty() {
        return Err("the host is empty".into());
    }
    if host.starts_with('-') || host.starts_with('.') {
        return Err(format!("host {host:?} cannot start with '{}'", &host[..1]));
    }
    if !host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':')) {
        return Err(format!("host {host:?} has a character a host name cannot contain (letters, digits, '.', '-', '_')"));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some(n),
            _ => return Err(format!("port {p:?} is not a number in 1..=65535")),
        },
    };
    Ok(Host { user, host, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(user: Option<&str>, host: &str, port: Option<u16>) -> Host {
        Host { user: user.map(str::to_owned), host: host.to_owned(), port }
    }

    #[test]
    fn every_accepted_form() {
        let text = "# cluster\n\n  node1  \nalice@node2:2222 # the second\n10.0.0.3:22\n[::1]:2200\n[fe80::2]\n::1\nbob@[::1]\nnode1\n";
        let hosts = parse("hosts", text).unwrap();
        assert_eq!(
            hosts,
            vec![
                host(None, "node1", None),
                host(Some("alice"), "node2", Some(2222)),
                host(None, "10.0.0.3", Some(22)),
                host(None, "::1", Some(2200)),
                host(None, "fe80::2", None),
                host(None, "::1", None),
                host(Some("bob"), "::1", None),
                host(None, "node1", None),
            ]
        );
        assert_eq!(hosts[1].destination(), "alice@node2");
        assert_eq!(hosts[1].to_string(), "alice@node2 (port 2222)");
        let loopback: Vec<bool> = hosts.iter().map(Host::is_loopback).collect();
        assert_eq!(loopback, [false, false, false, true, false, true, true, false]);
        assert!(host(None, "LocalHost", None).is_loopback() && host(None, "127.0.1.1", None).is_loopback());
    }

    #[test]
    fn bad_lines_are_named_with_the_fix() {
        let cases = [
            ("node1\nnode2 slots=4\n", 2, "more than one field"),
            ("node1:ssh", 1, "port \"ssh\" is not a number"),
            ("node1:0", 1, "port \"0\""),
            ("node1:70000", 1, "port \"70000\""),
            ("node1:", 1, "port \"\""),
            ("@node1", 1, "is not a user name"),
            ("a b@node1", 1, "more than one field"),
            ("us'er@node1", 1, "is not a user name"),
            ("-oProxyCommand=x", 1, "cannot start with '-'"),
            ("user@-x", 1, "cannot start with '-'"),
            ("no;de", 1, "cannot contain"),
            ("node$(x)", 1, "cannot contain"),
            (":22", 1, "the host is empty"),
            ("[::1", 1, "closing ']'"),
            ("[node1]:22", 1, "not an IPv6 address"),
            ("[::1]22", 1, "after ']'"),
            ("fe80::1:22x", 1, "not an IPv6 address"),
        ];
        for (text, line, needle) in cases {
            let e = parse("hosts.txt", text).unwrap_err();
            assert_eq!(e.line, Some(line), "{text:?}: {e}");
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("hostfile hosts.txt, line {line}: ")), "{msg}");
            assert!(msg.contains(needle) && msg.contains("one host per line"), "{text:?}: {msg}");
        }
    }

    #[test]
    fn a_file_without_hosts_is_refused() {
        for text in ["", "\n\n", "# only a comment\n   # another\n"] {
            let e = parse("h", text).unwrap_err();
            assert_eq!(e.line, None);
            assert!(e.to_string().contains("hostfile h: lists no hosts"), "{e}");
        }
        let e = read(Path::new("/nonexistent/hosts")).unwrap_err();
        assert!(e.to_string().starts_with("hostfile /nonexistent/hosts: cannot be read"), "{e}");
    }
}

#!/usr/bin/env python3
"""Emulated cluster: synkv `bench dist` vs torch gloo all_reduce between network namespaces.

Manual benchmark (plus a seconds-long `--check` that scripts/test-all.sh runs). Needs root, `ip`
and `tc`. See benches/netns/README.md.

    benches/netns/cluster.py --synkv target/release/synkv                  # W=2,4, 16M f32, 1gbit
    benches/netns/cluster.py --colocate --workers 4 --sizes 16M,1M
    benches/netns/cluster.py --check --synkv target/debug/synkv            # W=2 S=1, tiny, 10gbit

Each configuration (W workers, S servers) gets its own set of namespaces: one per "host" and one
holding a bridge (the switch). Every host has one veth `eth0` whose peer is a bridge port;
`tc tbf` at --rate shapes the host's egress (on eth0) and its ingress (on the bridge port), so
each host has a full-duplex link of that rate. This kernel has no `netem`: latency is NOT
emulated (a veth hop adds microseconds). Namespace names are `synkv-netns-<pid>-<random>-…`, so
parallel runs never clash; addresses (10.77.<n>.0/24) live only inside those namespaces.

Placement: by default the scheduler, each server and each worker have their own host (1+S+W
hosts). With --colocate, host i runs worker i and, for i < S, server i (the scheduler on host 0):
a worker's share of the key that lives on its own host's server goes through no link, as on a
real cluster. gloo's W ranks run on the W worker hosts (GLOO_SOCKET_IFNAME=eth0, MASTER_ADDR
the first worker host), started as benches/compare/torch_gloo.py --worker. Both sides verify
their values (synkv bench dist and torch_gloo.py fail on a wrong result).

Every synkv process gets a random SYNKV_SECRET (in its environment, never on a command line),
unless --plain (SYNKV_INSECURE=1: frames not sealed, to measure what sealing costs). Processes
on different emulated hosts are in different network namespaces, so they never share memory
(synkv's SYNKV_SHM treats another network namespace as another host).
Every wait is bounded (--timeout per job); processes and namespaces are removed on any exit
(exceptions, SIGINT, SIGTERM, SIGHUP). Exit status: 0 all jobs passed; 1 a job failed or the
check found leftovers; 2 bad arguments or missing synkv binary.
"""
import argparse, json, os, re, secrets, shutil, signal, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GLOO = os.path.join(ROOT, "benches", "compare", "torch_gloo.py")
PREFIX = "synkv-netns-"
ROOT_PORT, GLOO_PORT = 9091, 29500  # free: every host is a fresh namespace
# Variables a synkv or torch job reads: removed from the inherited environment.
JOB_VARS = re.compile(r"^(SYNKV_|DMLC_|MXNET_|PS_|PET_|SLURM_|OMPI_|PMI_|TORCHELASTIC_)|^(PORT|RANK|WORLD_SIZE|"
                      r"LOCAL_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|GLOO_SOCKET_IFNAME)$")


class Skip(Exception):
    """The machine cannot build namespaces: --check skips."""


def sh(*argv, check=True):
    """Runs a short ip/tc command (bounded); returns its stdout."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip() or 'exit %d' % r.returncode}")
    return r.stdout


def allow_congestion(cc):
    """Lets the namespaces pick TCP congestion control `cc`: outside the initial namespace Linux
    sets only algorithms listed in the host's net.ipv4.tcp_allowed_congestion_control, and
    cubic, its own default, is not always there (this machine's list has read `reno bbr`).
    Adds `cc` to that list (root, initial namespace) when the kernel has it. Returns a note
    saying what changed (None if nothing had to), or raises Skip saying what to do."""
    base = "/proc/sys/net/ipv4/"
    try:
        with open(base + "tcp_available_congestion_control") as f:
            available = f.read().split()
        with open(base + "tcp_allowed_congestion_control") as f:
            allowed = f.read().split()
    except OSError as e:
        raise Skip(f"cannot read this kernel's TCP congestion controls: {e}")
    if cc in allowed:
        return None
    if cc not in available:
        raise Skip(f"TCP congestion control {cc!r} is not in this kernel (it has {' '.join(available)}): "
                   f"modprobe tcp_{cc}, or pass --congestion with one of those or 'system'")
    wanted = " ".join(allowed + [cc])
    try:
        with open(base + "tcp_allowed_congestion_control", "w") as f:
            f.write(wanted)
    except OSError as e:
        raise Skip(f"TCP congestion control {cc!r} is not in net.ipv4.tcp_allowed_congestion_control "
                   f"({' '.join(allowed)}), which namespaces may choose from, and adding it failed ({e}): "
                   f"run `sysctl -w net.ipv4.tcp_allowed_congestion_control='{wanted}'` as root, or pass --congestion system")
    return f"added {cc} to net.ipv4.tcp_allowed_congestion_control (was: {' '.join(allowed)})"


def machine():
    """One line naming the CPU, the widest SIMD its kernels and BLAKE3 can use, and the cores
    (benches/compare/machine.sh prints the same for the shell scripts)."""
    model, flags = "unknown cpu", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown cpu":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    simd = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse or less"
    return f"machine: {model}; simd: {simd}; cores: {os.cpu_count()}"


def rate_bits(rate):
    """'1gbit' -> 1e9 (tc's units: bit, kbit, mbit, gbit are powers of 1000)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)", rate.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"--rate {rate!r}: want e.g. 100mbit, 1gbit, 10gbit")
    return float(m[1]) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}[m[2]]


def elements(s):
    """'16M' -> 16777216 elements (K, M: powers of 1024)."""
    m = re.fullmatch(r"(\d+)([KkMm]?)", s.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r}: want e.g. 4096, 64K, 16M")
    return int(m[1]) << {"": 0, "k": 10, "m": 20}[m[2].lower()]


def ints(s):
    return [int(x) for x in s.split(",")]


def stale_namespaces():
    """Namespaces of earlier runs whose process is gone (SIGKILLed runs leave them)."""
    out = []
    for ns in sh("ip", "netns", "list", check=False).split("\n"):
        m = re.match(PREFIX + r"(\d+)-", ns.split(" ")[0])
        if m and not os.path.exists(f"/proc/{m[1]}"):
            out.append(ns.split(" ")[0])
    return out


class Cluster:
    """Namespaces h0..h{n-1} and a bridge namespace; removed (with their processes) by close()."""

    def __init__(self, hosts, rate, congestion):
        self.run = f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
        self.br = f"{self.run}-br"
        self.ns = [f"{self.run}-h{i}" for i in range(hosts)]
        self.ip = [f"10.77.{int(self.run[-4:], 16) % 250 + 1}.{i + 1}" for i in range(hosts)]
        self.procs = []
        self.created = []
        try:
            self._build(rate, congestion)
        except BaseException:
            self.close()
            raise

    def _add_ns(self, ns):
        r = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise Skip(f"`ip netns add` failed: {r.stderr.strip()}")
        self.created.append(ns)

    def _build(self, rate, congestion):
        bps = rate_bits(rate)
        # Burst: 4 ms at the rate (>= rate/HZ for any HZ >= 250), at least 128 KiB (a veth GSO
        # packet is up to 64 KiB). Queue: 10 ms at the rate, at least 1 MiB, as a switch port buffer.
        burst = max(128 << 10, int(bps / 8 * 0.004))
        limit = max(1 << 20, int(bps / 8 * 0.010))
        tbf = ["tbf", "rate", rate, "burst", str(burst), "limit", str(limit)]
        self._add_ns(self.br)
        try:
            sh("ip", "-n", self.br, "link", "add", "br0", "type", "bridge")
        except RuntimeError as e:
            raise Skip(f"no bridge device: {e}")
        sh("ip", "-n", self.br, "link", "set", "br0", "up")
        for i, (ns, ip) in enumerate(zip(self.ns, self.ip)):
            self._add_ns(ns)
            try:
                sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", self.br)
            except RuntimeError as e:
                raise Skip(f"no veth pair: {e}")
            sh("ip", "-n", self.br, "link", "set", f"p{i}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            if congestion != "system":  # a per-namespace sysctl: every TCP socket of the host
                try:
                    sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={congestion}")
                except RuntimeError as e:
                    raise Skip(f"TCP congestion control {congestion!r}: {e}")
            try:
                sh("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", *tbf)       # host egress
                sh("tc", "-n", self.br, "qdisc", "add", "dev", f"p{i}", "root", *tbf)  # host ingress
            except RuntimeError as e:
                raise Skip(f"tc tbf is not available: {e}")

    def shaped(self):
        """True when every host's eth0 and every bridge port has its tbf qdisc."""
        ok = all("tbf" in sh("tc", "-n", ns, "qdisc", "show", "dev", "eth0") for ns in self.ns)
        return ok and sh("tc", "-n", self.br, "qdisc", "show").count("qdisc tbf") == len(self.ns)

    def sent_bytes(self, host):
        """Bytes the host's eth0 tbf has sent (tc -s)."""
        m = re.search(r"Sent (\d+) bytes", sh("tc", "-s", "-n", self.ns[host], "qdisc", "show", "dev", "eth0"))
        return int(m[1]) if m else 0

    def drops(self):
        """Packets every tbf (hosts' egress and ingress) has dropped so far (tc -s): a link's
        queue overflowing, e.g. several senders into one host at once (incast)."""
        text = "".join(sh("tc", "-s", "-n", ns, "qdisc", "show", "dev", "eth0") for ns in self.ns)
        text += sh("tc", "-s", "-n", self.br, "qdisc", "show")
        return sum(int(m) for m in re.findall(r"dropped (\d+)", text))

    def start(self, host, argv, env, log):
        """Starts argv on host `host` (its own process group) with stdout+stderr to `log`."""
        with open(log, "w") as f:
            p = subprocess.Popen(["ip", "netns", "exec", self.ns[host]] + argv, env=env, stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def kill(self, procs):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(timeout=10)

    def close(self):
        self.kill(self.procs)
        for ns in reversed(self.created):
            # Anything still inside (a grandchild that left the process group) was started by us.
            for pid in sh("ip", "netns", "pids", ns, check=False).split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)
        self.created = []

    def leftovers(self):
        return [ns for ns in sh("ip", "netns", "list", check=False).split("\n") if ns.startswith(self.run)]


def job_env(extra):
    env = {k: v for k, v in os.environ.items() if not JOB_VARS.search(k)}
    env.update(extra)
    return env


def wait_job(procs, timeout, logs):
    """Waits (bounded) for every process; returns an error string or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        bad = [(logs[i], c) for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            return "exit " + ", ".join(f"{c} ({os.path.basename(l)})" for l, c in bad)
        if all(c == 0 for c in codes):
            return None
        time.sleep(0.05)
    running = [os.path.basename(logs[i]) for i, p in enumerate(procs) if p.poll() is None]
    return f"timed out after {timeout:g} s ({', '.join(running)} still running)"


def records(logs, impl):
    out = []
    for log in logs:
        with open(log) as f:
            for line in f:
                try:
                    r = json.loads(line) if line.startswith("{") else {}
                except ValueError:  # a log line cut into by another write
                    continue
                if r.get("impl") == impl:
                    out.append(r)
    return out


def run_synkv(c, a, tmp, w, s, size, place):
    """One synkv job; returns the max over workers of their median ms (or raises)."""
    base = {"DMLC_PS_ROOT_URI": c.ip[place["sched"]], "DMLC_PS_ROOT_PORT": str(ROOT_PORT),
            "DMLC_NUM_WORKER": str(w), "DMLC_NUM_SERVER": str(s), "SYNKV_LOG": "warn"}
    if a.partition_bytes:
        base["SYNKV_PARTITION_BYTES"] = str(a.partition_bytes)
    base.update(a.synkv_env)
    if a.plain:  # no secret: frames are not sealed (the cost of sealing, measured against it)
        base["SYNKV_INSECURE"] = "1"
    else:
        base["SYNKV_SECRET"] = secrets.token_hex(32)
    procs, logs = [], []
    roles = [("scheduler", place["sched"], ["scheduler"])]
    roles += [(f"server{i}", h, ["server"]) for i, h in enumerate(place["servers"])]
    bench = ["bench", "dist", "--size", str(size), "--iters", str(a.iters), "--warmup", str(a.warmup), "--json"]
    if a.pushpull:
        bench.append("--pushpull")
    roles += [(f"worker{i}", h, bench) for i, h in enumerate(place["workers"])]
    for name, host, cmd in roles:
        role = "worker" if name.startswith("worker") else name.rstrip("0123456789")
        env = job_env(dict(base, DMLC_ROLE=role, DMLC_NODE_HOST=c.ip[host]))
        logs.append(os.path.join(tmp, f"synkv-{w}w{s}s-{size}-{name}.log"))
        procs.append(c.start(host, [a.synkv] + cmd, env, logs[-1]))
    return finish_job(c, a, procs, logs, [l for l in logs if "worker" in l], "synkv", w)


def finish_job(c, a, procs, logs, result_logs, impl, w):
    """Waits for a job; returns the max over its W ranks of their median ms, or kills what is
    left of a failed job (before the next one reuses the ports) and raises JobFailed."""
    err = wait_job(procs, a.timeout, logs)
    recs = records(result_logs, impl)
    if err is None and len(recs) != w:
        err = f"{len(recs)} result lines from {w} ranks"
    if err:
        c.kill(procs)
        raise JobFailed("synkv" if impl == "synkv" else "gloo", err, logs)
    return max(r["median_ms"] for r in recs)


def run_gloo(c, a, tmp, w, size, place):
    """One torch gloo job on the worker hosts; returns the max over ranks of their median ms."""
    procs, logs = [], []
    for r, host in enumerate(place["workers"]):
        env = job_env({"RANK": str(r), "WORLD_SIZE": str(w), "MASTER_ADDR": c.ip[place["workers"][0]],
                       "MASTER_PORT": str(GLOO_PORT), "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"})
        logs.append(os.path.join(tmp, f"gloo-{w}w-{size}-rank{r}.log"))
        procs.append(c.start(host, [a.python, GLOO, "--worker", "--size", str(size), "--iters", str(a.iters),
                                    "--warmup", str(a.warmup), "--json"], env, logs[-1]))
    return finish_job(c, a, procs, logs, logs, "torch", w)


class JobFailed(Exception):
    def __init__(self, what, err, logs):
        tails = []
        for l in logs:
            with open(l, errors="replace") as f:
                lines = [x.rstrip() for x in f if not x.startswith("{")][-4:]
            tails += [f"    {os.path.basename(l)}: {x}" for x in lines]
        super().__init__(f"{what} job failed: {err}\n" + "\n".join(tails))


def placement(w, s, colocate):
    """Host indices of the scheduler, the servers and the workers; the number of hosts."""
    if colocate:
        return {"sched": 0, "servers": list(range(s)), "workers": list(range(w))}, max(w, s)
    return {"sched": 0, "servers": list(range(1, 1 + s)), "workers": list(range(1 + s, 1 + s + w))}, 1 + s + w


def floors_ms(w, s, size, colocate, bps):
    """Line-rate lower bounds in ms, the key split evenly over the servers, no overhead: synkv
    with push and pull overlapped (the busiest link direction over a whole iteration), synkv
    with the pull after the push (each phase's busiest link direction, added), and gloo's ring
    all_reduce (2 (W-1)/W of the data each way per host, both directions at once)."""
    b, ms = size * 4, lambda nbytes: nbytes * 8 / bps * 1e3
    links = []  # per host: (push out, push in); the pull phase is the mirror image (in, out)
    if colocate:
        for h in range(max(w, s)):
            wk, sv = h < w, h < s  # the parts for (from) the other servers (workers) cross the link
            links.append((b * (s - sv) / s if wk else 0, b / s * (w - wk) if sv else 0))
    else:
        links = [(b, 0), (0, b / s * w)]  # a worker's host, a server's host
    overlapped = max(o + i for o, i in links)  # each direction: one phase's out + the other's
    phases = 2 * max(max(o, i) for o, i in links)
    return ms(overlapped), ms(phases), ms(2 * (w - 1) / w * b)


def have_torch(python):
    try:
        r = subprocess.run([python, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                           capture_output=True, timeout=120)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def default_python():
    for p in ("/usr/bin/python3", shutil.which("python3") or ""):  # Debian's python3-torch first
        if p and have_torch(p):
            return p
    return "python3"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--synkv", default=os.environ.get("SYNKV_BIN", os.path.join(ROOT, "target", "release", "synkv")),
                   help="synkv binary (default: $SYNKV_BIN, else target/release/synkv)")
    p.add_argument("--workers", type=ints, default=[2, 4], help="comma-separated W values (default 2,4)")
    p.add_argument("--servers", type=int, default=0, help="S (default: S = W)")
    p.add_argument("--sizes", type=lambda s: [elements(x) for x in s.split(",")], default=[16 << 20],
                   help="f32 elements per key, comma-separated, K/M suffixes (default 16M)")
    p.add_argument("--rate", default="1gbit", help="each host's link rate, each direction (tc units)")
    p.add_argument("--congestion", default="cubic",
                   help="every host's TCP congestion control (default cubic, Linux's default; 'system' keeps this "
                        "machine's, which new namespaces inherit)")
    p.add_argument("--colocate", action="store_true", help="server i and worker i share host i")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300, help="seconds per job")
    p.add_argument("--python", default=None, help="interpreter with torch for gloo (default: the first of "
                   "/usr/bin/python3, python3 that imports torch)")
    p.add_argument("--no-gloo", action="store_true", help="run synkv only")
    p.add_argument("--plain", action="store_true", help="synkv without a secret (SYNKV_INSECURE=1): frames not sealed")
    p.add_argument("--partition-bytes", type=elements, default=None,
                   help="SYNKV_PARTITION_BYTES for the synkv job (K/M suffixes; default: synkv's)")
    p.add_argument("--synkv-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a SYNKV_* variable for every synkv process (repeatable), e.g. SYNKV_TRACE_DIR=/tmp/t")
    p.add_argument("--pushpull", action="store_true",
                   help="synkv iterations are one pushpull (parts answered as their rounds complete) instead of push, then pull")
    p.add_argument("--check", action="store_true", help="seconds-long self-test: W=2 S=1, 64K, 10gbit, 3 iters")
    p.add_argument("--cleanup-stale", action="store_true", help="remove namespaces of dead earlier runs, then exit")
    a = p.parse_args()
    rate_bits(a.rate)
    env_pairs = [kv.split("=", 1) for kv in a.synkv_env]
    if any(len(kv) != 2 or not kv[0].startswith("SYNKV_") for kv in env_pairs):
        p.error(f"--synkv-env wants SYNKV_NAME=VALUE, got {a.synkv_env}")
    a.synkv_env = dict(env_pairs)
    if a.check:
        a.workers, a.servers, a.sizes, a.rate, a.iters, a.warmup = [2], 1, [65536], "10gbit", 3, 1
        a.timeout = min(a.timeout, 60)

    def skip(msg):
        if not a.check:
            print(f"cluster.py: {msg}", file=sys.stderr)
            return 2
        print(f"SKIPPED (netns): {msg}")
        return 0

    if os.geteuid() != 0:
        return skip("network namespaces need root")
    if not (shutil.which("ip") and shutil.which("tc")):
        return skip("`ip` or `tc` (iproute2) is missing")
    stale = stale_namespaces()
    if a.cleanup_stale:
        for ns in stale:
            for pid in sh("ip", "netns", "pids", ns, check=False).split():
                os.kill(int(pid), signal.SIGKILL)
            sh("ip", "netns", "del", ns, check=False)
        print(f"removed {len(stale)} stale namespace(s)")
        return 0
    if stale:
        print(f"note: {len(stale)} namespace(s) of dead runs remain ({stale[0]} …); "
              "remove them with --cleanup-stale", file=sys.stderr)
    if not (os.path.isfile(a.synkv) and os.access(a.synkv, os.X_OK)):
        print(f"cluster.py: no synkv binary at {a.synkv} (build it: cargo build --release -p synkv-cli, "
              "or pass --synkv / SYNKV_BIN)", file=sys.stderr)
        return 2
    a.synkv = os.path.abspath(a.synkv)
    if a.congestion != "system":
        try:
            note = allow_congestion(a.congestion)
        except Skip as e:
            if not a.check:
                return skip(str(e))
            # The check verifies values and shaping, which any congestion control shows.
            print(f"note: {e}; the check goes on with this machine's own", file=sys.stderr)
            a.congestion = "system"
        else:
            if note:
                print(f"note: {note}", file=sys.stderr)
    gloo = None
    if not a.no_gloo:
        a.python = a.python or default_python()
        if have_torch(a.python):
            gloo = a.python
        else:
            print(f"note: {a.python} has no torch with gloo; the gloo column is n/a "
                  "(apt-get install -y python3-torch, or --python)", file=sys.stderr)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, f: sys.exit(128 + n))
    bps = rate_bits(a.rate)
    cc = a.congestion if a.congestion != "system" else sh("sysctl", "-n", "net.ipv4.tcp_congestion_control").strip()
    print(f"links: {a.rate} per host each direction (tc tbf), TCP congestion control {cc}; latency NOT emulated (no netem in this "
          f"kernel); placement: {'colocated server+worker per host' if a.colocate else 'one role per host'}; "
          f"{a.iters} iters after {a.warmup} warmup; synkv {a.synkv}; gloo {gloo or 'n/a'}", flush=True)
    print(machine(), flush=True)
    rows, failed = [], 0
    tmp = tempfile.mkdtemp(prefix="synkv-netns-")
    try:
        for w in a.workers:
            s = a.servers or w
            place, hosts = placement(w, s, a.colocate)
            try:
                c = Cluster(hosts, a.rate, a.congestion)
            except Skip as e:
                return skip(str(e))
            try:
                if a.check and not c.shaped():
                    print("FAIL: a tbf qdisc is missing", file=sys.stderr)
                    failed += 1
                for size in a.sizes:
                    row = {"w": w, "s": s, "size": size, "synkv": None, "gloo": None}
                    dropped = c.drops()
                    try:
                        row["synkv"] = run_synkv(c, a, tmp, w, s, size, place)
                    except JobFailed as e:
                        print(e, file=sys.stderr)
                        failed += 1
                    now = c.drops()
                    row["synkv_drops"], dropped = now - dropped, now
                    # Each worker pushed its array every iteration: through its shaped eth0.
                    if a.check and row["synkv"]:
                        low = [h for h in place["workers"] if c.sent_bytes(h) < size * 4 * (a.iters + a.warmup)]
                        if low:
                            print(f"FAIL: worker hosts {low} sent less than they pushed through tbf", file=sys.stderr)
                            failed += 1
                    if gloo:
                        try:
                            row["gloo"] = run_gloo(c, a, tmp, w, size, place)
                        except JobFailed as e:
                            print(e, file=sys.stderr)
                            failed += 1
                        row["gloo_drops"] = c.drops() - dropped
                    row["floors"] = floors_ms(w, s, size, a.colocate, bps)
                    rows.append(row)
                    print("  " + fmt(row), flush=True)
            finally:
                c.close()
                left = c.leftovers()
                if left:
                    print(f"FAIL: namespaces left after cleanup: {left}", file=sys.stderr)
                    failed += 1
    finally:
        if failed == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs kept in {tmp}", file=sys.stderr)
    print()
    print(table(rows, a))
    if a.check:
        if failed:
            print(f"netns check FAILED ({failed} problem(s) above)")
        else:
            print(f"netns check ok: synkv{' and gloo' if gloo else ''} values verified, traffic went through "
                  "the tbf links, namespaces removed")
    return 1 if failed else 0


def fmt(r):
    g = f"{r['gloo']:.1f} ms" if r["gloo"] else "n/a"
    s = f"{r['synkv']:.1f} ms" if r["synkv"] else "FAIL"
    drops = f"; packets dropped at the links: synkv {r.get('synkv_drops')}, gloo {r.get('gloo_drops', 'n/a')}"
    return f"W={r['w']} S={r['s']} size={r['size']}: synkv {s}, gloo {g}{drops}"


def table(rows, a):
    ms = lambda r, k: f"{r[k]:.1f}" if r[k] else ("FAIL" if k == "synkv" else "n/a")
    gb = lambda r, k: f"{r['size'] * 4 * 2 / (r[k] / 1e3) / 1e9:.3f}" if r[k] else "n/a"
    lines = ["| W | S | size (f32) | synkv ms | gloo ms | gloo ms / synkv ms | synkv GB/s | gloo GB/s "
             "| floor ms: synkv overlapped / push then pull / gloo |",
             "|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        ratio = f"{r['gloo'] / r['synkv']:.2f}" if r["gloo"] and r["synkv"] else "n/a"
        lines.append(f"| {r['w']} | {r['s']} | {r['size']} | {ms(r, 'synkv')} | {ms(r, 'gloo')} | {ratio} "
                     f"| {gb(r, 'synkv')} | {gb(r, 'gloo')} | {' / '.join('%.1f' % f for f in r['floors'])} |")
    lines.append(f"\nms: the slowest worker's (rank's) median over {a.iters} iterations; GB/s: size x 4 B x 2 "
                 f"per worker / that time (synkv {'pushpull' if a.pushpull else 'push+pull'}, gloo all_reduce); gloo ms / synkv ms = synkv's "
                 f"throughput over gloo's. Floors: the busiest link at {a.rate}, no overheads "
                 f"(benches/netns/README.md).")
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)

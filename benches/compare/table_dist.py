#!/usr/bin/env python3
"""Print the synkv-vs-MXNet (vs torch gloo) distributed comparison table.

Usage:
    table_dist.py RESULTS.jsonl --case 'LABEL|SIZE|KEYS|SERVERS|UPDATER|TARGET' [--case ...]

Lines of RESULTS.jsonl: per-worker records of `synkv bench dist --json`, `mxnet_dist.py
--json`, `torch_gloo.py --json` (each tagged by run_dist.sh with "run", one id per job), and
one `loopback_bw.py --json` record. A job's time is the MAX over its workers of their
median_ms (the slowest worker bounds a sync round); several jobs of the same case (rounds) are
combined by their median. An MXNet record with "median_ms": null and "error" (the job
aborted) is shown as ABORT. torch rows match on size and keys only (all_reduce has no servers
or updater). TARGET: highest acceptable synkv/mxnet ratio, '-' for informative.

Also prints synkv's GB/s (bytes pushed + pulled per worker / job time) next to the loopback
TCP GB/s, and synkv's 100-key-vs-1M time ratio (target <= 1.2) per servers/updater.
Exit status: 0 all targeted cases PASS; 1 a targeted case FAILs or is missing; 2 bad input.
Standard library only.
"""
import argparse, json, statistics, sys


def parse_case(s):
    p = s.split("|")
    if len(p) != 6:
        raise argparse.ArgumentTypeError(f"bad --case {s!r}")
    label, size, keys, servers, updater, target = p
    return dict(label=label, size=int(size), keys=int(keys), servers=int(servers), updater=updater,
                target=None if target in ("", "-") else float(target))


def load(path):
    jobs, errors, loop = {}, {}, []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
                if r["impl"] == "loopback":
                    loop.append(float(r["gbps"])); continue
                if r["impl"] == "torch":
                    key = ("torch", int(r["size"]), int(r["keys"]))
                else:
                    key = (r["impl"], int(r["size"]), int(r["keys"]), int(r["servers"]), r["updater"])
                if r.get("median_ms") is None:
                    errors.setdefault(key, []).append(r.get("error", "failed"))
                    continue
                jobs.setdefault(key, {}).setdefault(r.get("run", f"line{n}"), []).append(float(r["median_ms"]))
            except (ValueError, KeyError, TypeError) as e:
                print(f"{path}:{n}: skipping unparsable line ({e}): {line[:120]}", file=sys.stderr)
    # per job: max over workers; over jobs: median
    ms = {k: (statistics.median(max(v) for v in runs.values()), len(runs)) for k, runs in jobs.items()}
    return ms, errors, (statistics.median(loop) if loop else None)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--case", type=parse_case, action="append", required=True)
    ap.add_argument("--allow-missing", action="store_true")
    a = ap.parse_args(argv)
    ms, errors, loop = load(a.results)

    def cell(key):
        if key in ms:
            v, n = ms[key]
            return v, f"{v:.3f}" + (f" (n={n})" if n > 1 else "")
        if key in errors:
            return None, "ABORT"
        return None, "-"

    header = ["case", "synkv ms", "mxnet ms", "torch ms", "synkv/mxnet", "target", "result", "synkv GB/s", "% loopback"]
    rows, ok, notes = [], True, []
    for c in a.case:
        s, s_txt = cell(("synkv", c["size"], c["keys"], c["servers"], c["updater"]))
        m, m_txt = cell(("mxnet", c["size"], c["keys"], c["servers"], c["updater"]))
        _, t_txt = cell(("torch", c["size"], c["keys"]))
        ratio = s / m if (s is not None and m) else None
        mkey = ("mxnet", c["size"], c["keys"], c["servers"], c["updater"])
        if mkey in errors and m is None:
            notes.append(f"({c['label']}) mxnet: {errors[mkey][0]}")
        if c["target"] is None:
            verdict = "info"
        elif ratio is None:
            verdict = ("n/a" if a.allow_missing else "MISSING") if m_txt != "ABORT" else "MXNET ABORT"
            ok = ok and (a.allow_missing or m_txt == "ABORT") and s is not None
        else:
            verdict = "PASS" if ratio <= c["target"] else "FAIL"
            ok = ok and verdict == "PASS"
        gbps = c["keys"] * c["size"] * 8 / (s / 1e3) / 1e9 if s else None
        rows.append([f"({c['label']}) {c['keys']}x{c['size']} s={c['servers']} {c['updater']}",
                     s_txt, m_txt, t_txt, "-" if ratio is None else f"{ratio:.3f}",
                     "-" if c["target"] is None else f"<= {c['target']:g}", verdict,
                     "-" if gbps is None else f"{gbps:.2f}",
                     "-" if (gbps is None or not loop) else f"{100 * gbps / loop:.0f}%"])
    w = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    fmt = lambda r: "  ".join(v.ljust(w[i]) if i == 0 else v.rjust(w[i]) for i, v in enumerate(r))
    print(fmt(header)); print("  ".join("-" * x for x in w))
    for r in rows:
        print(fmt(r))
    print()
    print("loopback TCP 127.0.0.1: " + (f"{loop:.2f} GB/s (1 stream, 4 MiB writes)" if loop else "not measured"))
    print("synkv GB/s = keys x size x 4 B x 2 (push + pull) per worker / job time (max over workers of the median)")
    # 100 x 10K vs 1M, synkv
    small = {(c["servers"], c["updater"]): c for c in a.case if c["keys"] == 100}
    for (sv, up), c in sorted(small.items()):
        big = ms.get(("synkv", 1 << 20, 1, sv, up))
        many = ms.get(("synkv", c["size"], c["keys"], sv, up))
        if big and many:
            r = many[0] / big[0]
            v = "PASS" if r <= 1.2 else "FAIL"
            ok = ok and v == "PASS"
            print(f"synkv {c['keys']}x{c['size']} / 1x1048576 (s={sv} {up}): {r:.3f}  target <= 1.2  {v}")
    for n in notes:
        print("note: " + n)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

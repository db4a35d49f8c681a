#!/usr/bin/env python3
"""Print the server-memory table: synkv's vs MXNet's dist_sync server peak RSS for one big key.

Usage:
    table_rss.py RESULTS.jsonl [--size N] [--workers "2 4 8"] [--target 3.0] [--allow-missing]

Lines of RESULTS.jsonl: per-worker records of `synkv bench dist --report-rss --json` (under
`synkv launch`) and `mxnet_dist.py --report-rss --json`, tagged by run_rss.sh with "run" (one
id per job). Every line carries "server_peak_rss_mb" (one float per server, MiB: the server's
VmHWM) and "key_mb" (the key's size, MiB). Only 1-key, 1-server records are used; with --size,
only that size.

Per W and side: the server peak RSS is the MAX over jobs (rounds) and servers of the reported
value (a memory bound is a worst case); the time is, as in table_dist.py, the max over a job's
workers of their median_ms, jobs combined by their median. ratio = peak RSS / key MiB. synkv's
ratio PASSes when <= --target (default 3.0). A side with no record shows n/a; an MXNet job that
failed (median_ms null) shows ABORT.
Exit status: 0 every synkv ratio passes (with --allow-missing, missing ones are not failures);
1 a synkv ratio fails or is missing; 2 bad input. Standard library only.
"""
import argparse, json, statistics, sys


def load(path, size):
    jobs = {}     # (impl, W) -> run -> {"ms": [...], "rss": [...], "key_mb": float}
    errors = {}   # (impl, W) -> [error, ...]
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
                if r.get("impl") not in ("synkv", "mxnet"):
                    continue
                if int(r["keys"]) != 1 or int(r["servers"]) != 1:
                    continue
                if size is not None and int(r["size"]) != size:
                    continue
                key = (r["impl"], int(r["workers"]))
                if r.get("median_ms") is None:
                    errors.setdefault(key, []).append(r.get("error", "failed"))
                    continue
                job = jobs.setdefault(key, {}).setdefault(
                    r.get("run", f"line{n}"), {"ms": [], "rss": [], "key_mb": None})
                job["ms"].append(float(r["median_ms"]))
                rss = r.get("server_peak_rss_mb")
                if rss:
                    job["rss"].append(max(float(x) for x in rss))
                job["key_mb"] = float(r["key_mb"]) if r.get("key_mb") is not None \
                    else int(r["size"]) * 4 / 2**20
            except (ValueError, KeyError, TypeError) as e:
                print(f"{path}:{n}: skipping unparsable line ({e}): {line[:120]}", file=sys.stderr)
    out = {}
    for key, runs in jobs.items():
        rss = [max(j["rss"]) for j in runs.values() if j["rss"]]
        out[key] = dict(
            ms=statistics.median(max(j["ms"]) for j in runs.values()),
            rss=max(rss) if rss else None,
            key_mb=next(j["key_mb"] for j in runs.values()),
            n=len(runs))
    return out, errors


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--size", type=int, help="f32 elements of the key (default: any)")
    ap.add_argument("--workers", help='worker counts to show, e.g. "2 4 8" (default: all found)')
    ap.add_argument("--target", type=float, default=3.0, help="highest passing synkv RSS / key size")
    ap.add_argument("--allow-missing", action="store_true")
    a = ap.parse_args(argv)
    try:
        res, errors = load(a.results, a.size)
        ws = [int(w) for w in a.workers.split()] if a.workers else \
            sorted({w for _, w in list(res) + list(errors)})
    except (OSError, ValueError) as e:
        print(f"table_rss.py: {e}", file=sys.stderr)
        return 2

    header = ["W", "key MiB", "synkv RSS MiB", "synkv RSS/key", "result",
              "mxnet RSS MiB", "mxnet RSS/key", "synkv ms", "mxnet ms"]
    rows, ok, notes = [], True, []
    for w in ws:
        s, m = res.get(("synkv", w)), res.get(("mxnet", w))
        key_mb = (s or m or {}).get("key_mb")
        if key_mb is None and a.size:
            key_mb = a.size * 4 / 2**20

        def cells(impl, d):
            if d is None:
                if (impl, w) in errors:
                    notes.append(f"W={w} {impl}: {errors[(impl, w)][0]}")
                    return None, "ABORT", "-", "ABORT"
                return None, "n/a", "n/a", "n/a"
            n = f" (n={d['n']})" if d["n"] > 1 else ""
            if d["rss"] is None:
                return None, "n/a", "n/a", f"{d['ms']:.1f}{n}"
            ratio = d["rss"] / key_mb if key_mb else None
            return (ratio, f"{d['rss']:.1f}", "-" if ratio is None else f"{ratio:.2f}",
                    f"{d['ms']:.1f}{n}")

        s_ratio, s_rss, s_rtxt, s_ms = cells("synkv", s)
        _, m_rss, m_rtxt, m_ms = cells("mxnet", m)
        if s_ratio is None:
            verdict = "n/a" if a.allow_missing else "MISSING"
            ok = ok and a.allow_missing
        else:
            verdict = "PASS" if s_ratio <= a.target else "FAIL"
            ok = ok and verdict == "PASS"
        key_txt = "-" if key_mb is None else f"{key_mb:.1f}" if key_mb >= 1 else f"{key_mb:.3g}"
        rows.append([str(w), key_txt, s_rss, s_rtxt, verdict,
                     m_rss, m_rtxt, s_ms, m_ms])
    if not rows:
        print("table_rss.py: no worker counts to show", file=sys.stderr)
        return 2
    wd = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    fmt = lambda r: "  ".join(v.rjust(wd[i]) for i, v in enumerate(r))
    print(fmt(header)); print("  ".join("-" * x for x in wd))
    for r in rows:
        print(fmt(r))
    print()
    print(f"RSS = the server's peak resident set (VmHWM), max over servers and jobs; "
          f"result: synkv RSS/key <= {a.target:g} (PASS)")
    print("ms = max over a job's workers of their median push+pull round, median over jobs")
    for n in notes:
        print("note: " + n)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

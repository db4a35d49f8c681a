#!/usr/bin/env python3
"""Print the synkv-vs-MXNet comparison table from a bench-results/*.jsonl file.

Usage:
    table.py RESULTS.jsonl --case 'LABEL|SIZE|DEVICES|KEYS|UPDATER|TARGET' [--case ...]

TARGET is the highest acceptable synkv/mxnet ratio, or '-' for an informative
case without a target.

Each line of RESULTS.jsonl is one JSON object as printed by
`synkv bench local --json` or `mxnet_local.py --json`. Several runs of the same
case by the same impl (interleaved rounds) are combined by taking the median of
their per-run median_ms. ratio = synkv_ms / mxnet_ms (lower is better for synkv).

Exit status: 0 if every case with a target has both numbers and PASSes,
1 if any such case FAILs or is missing a number (unless --allow-missing, for
one-sided runs), 2 on bad input.
Standard library only.
"""

import argparse
import json
import statistics
import sys


def parse_case(s):
    parts = s.split("|")
    if len(parts) != 6:
        raise argparse.ArgumentTypeError(f"bad --case {s!r}: want LABEL|SIZE|DEVICES|KEYS|UPDATER|TARGET")
    label, size, devices, keys, updater, target = parts
    return {
        "label": label,
        "key": (int(size), int(devices), int(keys), updater),
        "target": None if target in ("", "-") else float(target),
    }


def load(path):
    runs = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
                key = (int(r["size"]), int(r["devices"]), int(r["keys"]), r["updater"])
                runs.setdefault((r["impl"], key), []).append(float(r["median_ms"]))
            except (ValueError, KeyError, TypeError) as e:
                print(f"{path}:{n}: skipping unparsable line ({e}): {line[:120]}", file=sys.stderr)
    return runs


def fmt_ms(v):
    return "-" if v is None else f"{v:.3f}"


def main(argv=None):
    p = argparse.ArgumentParser(description="synkv vs MXNet comparison table")
    p.add_argument("results")
    p.add_argument("--case", type=parse_case, action="append", required=True)
    p.add_argument("--allow-missing", action="store_true",
                   help="a case lacking one side's number is 'n/a', not a failure (one-sided runs)")
    a = p.parse_args(argv)

    runs = load(a.results)
    header = ["case", "synkv ms", "mxnet ms", "ratio", "target", "result"]
    rows = []
    ok = True
    for c in a.case:
        size, devices, keys, updater = c["key"]
        name = f"({c['label']}) size={size} dev={devices} keys={keys} {updater}"
        med = {}
        counts = []
        for impl in ("synkv", "mxnet"):
            xs = runs.get((impl, c["key"]), [])
            med[impl] = statistics.median(xs) if xs else None
            counts.append(len(xs))
        s, m = med["synkv"], med["mxnet"]
        ratio = s / m if (s is not None and m) else None
        if c["target"] is None:
            verdict = "info"
        elif ratio is None:
            verdict = "n/a" if a.allow_missing else "MISSING"
            ok = ok and a.allow_missing
        elif ratio <= c["target"]:
            verdict = "PASS"
        else:
            verdict = "FAIL"
            ok = False
        rows.append([
            name,
            fmt_ms(s) + (f" (n={counts[0]})" if counts[0] > 1 else ""),
            fmt_ms(m) + (f" (n={counts[1]})" if counts[1] > 1 else ""),
            "-" if ratio is None else f"{ratio:.3f}",
            "-" if c["target"] is None else f"<= {c['target']:g}",
            verdict,
        ])

    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
    print(line(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

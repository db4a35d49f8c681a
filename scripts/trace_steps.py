#!/usr/bin/env python3
"""Where a step's time goes: one table per round from a job's trace files.

Reads the Chrome-trace files a job wrote with SYNKV_TRACE_DIR (docs/tracing.md) and prints,
for each round (a key part's round id: with every key pushed once per step, round = step),
every role's operations of that round on one time axis (µs from the round's first span):
how many spans, when the first started and the last ended, and their median and longest
duration. Spans of different processes share the wall clock, so the columns line up:
a worker's push from its start to the server's arrival is the copy and the transfer, the
server's sum starts once the last worker's push arrived, and the workers' push ends when
the server's answer came back. Below each table, every worker's step cut into stages: sent →
arrived (its first push sent to its last part's arrival at a server: the copy, the network,
the server's queue), wait others (to the round's last arrival: stragglers), server (the
sums and updates after that), answer (from their end to this worker's last answer) and
pull.

    SYNKV_TRACE_DIR=/tmp/tr SYNKV_TRACE_ROUNDS=300:303 synkv launch -n 2 -s 1 -- \\
        synkv bench dist --size 1048576 --iters 400
    scripts/trace_steps.py /tmp/tr            # every traced round
    scripts/trace_steps.py /tmp/tr 301 302    # these rounds

Exit status: 0, or 2 when the directory holds no trace file or no span of a round asked for.
"""

import argparse
import glob
import json
import os
import re
import statistics
import sys

FILE = re.compile(r"synkv-(?P<role>[a-z]+)-(?P<rank>\d+)-\d+\.json$")


def load(directory):
    """{role name: [complete spans]} of every trace file in `directory` (not flight dumps)."""
    roles = {}
    for path in sorted(glob.glob(os.path.join(directory, "synkv-*.json"))):
        m = FILE.search(os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            doc = json.load(f)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        roles[f"{m['role']} {m['rank']}"] = [e for e in events if e.get("ph") == "X"]
    return roles


def of_round(events, rnd, names=None):
    """The spans of round `rnd` among `events` (only those named in `names`, if given)."""
    return [e for e in events if e.get("args", {}).get("round") == rnd and (names is None or e["name"] in names)]


def table(roles, rnd):
    """The rows of round `rnd`: (role, op, n, first start, last start, first end, last end,
    median duration, longest), times in µs from the round's first span."""
    spans = {role: of_round(evs, rnd) for role, evs in roles.items()}
    starts = [e["ts"] for evs in spans.values() for e in evs]
    if not starts:
        return []
    t0 = min(starts)
    rows = []
    for role, evs in spans.items():
        ops = {}
        for e in evs:
            ops.setdefault(e["name"], []).append(e)
        for op, es in sorted(ops.items(), key=lambda kv: min(e["ts"] for e in kv[1])):
            st = [e["ts"] - t0 for e in es]
            en = [e["ts"] + e["dur"] - t0 for e in es]
            du = [e["dur"] for e in es]
            rows.append((role, op, len(es), min(st), max(st), min(en), max(en), statistics.median(du), max(du)))
    return rows


def stages(roles, rnd):
    """Each worker's step of round `rnd` cut into stages (µs): from its first push (or pushpull)
    sent to its last part's arrival at a server; the wait for the other workers' parts (the
    round's last arrival); the servers' sums and updates after that; from their end to this
    worker's last answer; and its pulls. None where a stage's spans are missing (no server
    file, an async store without sums, a step without pulls)."""
    servers = [evs for role, evs in roles.items() if role.startswith("server ")]
    workers = {role: evs for role, evs in roles.items() if role.startswith("worker ")}
    arrivals = {}
    for evs in servers:
        for e in of_round(evs, rnd, ("push",)):
            w = e["args"].get("worker")
            arrivals[w] = max(arrivals.get(w, e["ts"]), e["ts"])
    computed = [e["ts"] + e["dur"] for evs in servers for e in of_round(evs, rnd, ("sum", "update"))]
    last_arrival = max(arrivals.values()) if arrivals else None
    done = max(computed) if computed else None
    diff = lambda a, b: None if a is None or b is None else a - b
    rows = []
    for role, evs in sorted(workers.items()):
        rank = int(role.split()[1])
        pushes = of_round(evs, rnd, ("push", "pushpull"))
        pulls = of_round(evs, rnd, ("pull",))
        sent = min(e["ts"] for e in pushes) if pushes else None
        answered = max(e["ts"] + e["dur"] for e in pushes) if pushes else None
        arrived = arrivals.get(rank)
        pull = diff(max(e["ts"] + e["dur"] for e in pulls), min(e["ts"] for e in pulls)) if pulls else None
        rows.append((role, diff(arrived, sent), diff(last_arrival, arrived), diff(done, last_arrival), diff(answered, done), pull))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", help="the job's SYNKV_TRACE_DIR")
    p.add_argument("rounds", nargs="*", type=int, help="rounds to show (default: every traced round)")
    a = p.parse_args()
    roles = load(a.dir)
    if not roles:
        print(f"trace_steps.py: no synkv-<role>-<rank>-<pid>.json in {a.dir}", file=sys.stderr)
        return 2
    rounds = a.rounds or sorted({e["args"]["round"] for evs in roles.values() for e in evs if "round" in e.get("args", {})})
    status = 0
    for rnd in rounds:
        rows = table(roles, rnd)
        if not rows:
            print(f"trace_steps.py: no span of round {rnd} in {a.dir}", file=sys.stderr)
            status = 2
            continue
        print(f"round {rnd} (µs from its first span)")
        print(f"  {'role':10} {'op':16} {'n':>4} {'start':>15} {'end':>15} {'median':>7} {'max':>7}")
        for role, op, n, s0, s1, e0, e1, med, mx in rows:
            print(f"  {role:10} {op:16} {n:4d} {s0:7.0f}..{s1:<7.0f} {e0:7.0f}..{e1:<7.0f} {med:7.0f} {mx:7.0f}")
        print(f"  {'stages':10} {'sent→arrived':>13} {'wait others':>12} {'server':>8} {'answer':>8} {'pull':>8}")
        cell = lambda v: f"{v:.0f}" if v is not None else "-"
        for role, *vals in stages(roles, rnd):
            widths = (13, 12, 8, 8, 8)
            print(f"  {role:10} " + " ".join(f"{cell(v):>{w}}" for v, w in zip(vals, widths)))
    return status


if __name__ == "__main__":
    sys.exit(main())

"""One worker of test_real_job.py (issue 10's reproductions from Python), run under
`synkv launch` or started by the test. Never calls kv.close(): the store closes at exit.

    real_job_worker.py finish-apart SECS   rank r sleeps r * SECS after two sync rounds
    real_job_worker.py straggler SECS      rank 1 sleeps SECS between two sync pushes

Prints "rank R of N: trained" once the rounds are done, "rank R of N: ok" last."""

import sys
import time

import numpy as np

import synkv

case, secs = sys.argv[1], float(sys.argv[2])
kv = synkv.create("dist_sync")
rank, n = kv.rank, kv.num_workers
want = n * (n + 1) / 2
kv.init("w", np.zeros(8, np.float32))
for round in range(2):
    if case == "straggler" and round == 1 and rank == 1:
        time.sleep(secs)
    out = np.zeros(8, np.float32)
    kv.pushpull("w", np.full(8, rank + 1, np.float32), out=out)
    if not np.allclose(out, want):
        sys.exit(f"rank {rank}: round {round}: expected {want}, got {out[:4]}")
print(f"rank {rank} of {n}: trained", flush=True)
if case == "finish-apart":
    time.sleep(rank * secs)
print(f"rank {rank} of {n}: ok", flush=True)

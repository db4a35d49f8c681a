"""A worker of test_real_job.py's checkpoint tests, under `synkv launch`: SGD with momentum on
two keys, one push of both per round, rounds resumed_round+1 ..= ROUNDS; with CKPT_AT and
CKPT_DIR set, every worker takes a checkpoint after that round. Prints the final weights with
full precision: "rank R final <small> <big>".

    checkpoint_worker.py ROUNDS [CKPT_AT CKPT_DIR]"""

import sys

import numpy as np

import synkv
from synkv import optimizer

rounds = int(sys.argv[1])
at = int(sys.argv[2]) if len(sys.argv) > 3 else None
ckpt_dir = sys.argv[3] if len(sys.argv) > 3 else None
kv = synkv.create("dist_sync")
rank = kv.rank
start = kv.resumed_round or 0
print(f"rank {rank} starts after round {start}", flush=True)
kv.set_optimizer(optimizer.SGD(learning_rate=0.1, momentum=0.9))
keys = ["small", "big"]
shapes = [(3, 5), (1200, 1000)]
kv.init(keys, [np.ones(s, np.float32) for s in shapes])
for r in range(start + 1, rounds + 1):
    kv.push(keys, [np.full(s, rank + 1, np.float32) for s in shapes])
    if r == at:
        cid, cround = kv.checkpoint(ckpt_dir)
        print(f"rank {rank} checkpoint {cid} at round {cround}", flush=True)
outs = [np.zeros(s, np.float32) for s in shapes]
kv.pull(keys, out=outs)
print(f"rank {rank} final " + " ".join(repr(float(o.flat[0])) for o in outs), flush=True)

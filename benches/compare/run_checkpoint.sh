#!/usr/bin/env bash
# Checkpoint write and restore times of a dist job's server (issue 11): one server, one worker,
# SGD with momentum on a key of BIG_ELEMS floats, so the server's shard holds the value and the
# momentum (8 bytes per element: 134217728 elements = a 1 GiB shard). The job takes a checkpoint
# after round 1 (rank 0 logs "checkpoint 1 ... written ... in S s"); a second job restarts from
# it (the server logs "restored checkpoint ... read and checked in S s; serving T s after the
# server started"). Usage: SYNKV_BIN=target/release/synkv benches/compare/run_checkpoint.sh
set -euo pipefail
SYNKV_BIN=${SYNKV_BIN:-target/release/synkv}
BIG_ELEMS=${BIG_ELEMS:-134217728}
DIR=${CKPT_DIR:-$(mktemp -d /tmp/synkv-ckpt-bench.XXXXXX)}
trap 'rm -rf "$DIR"' EXIT
job() { "$SYNKV_BIN" launch -n 1 -s 1 -- "$SYNKV_BIN" selftest dist "$@" --big-elems "$BIG_ELEMS" 2>&1; }

SYNKV_LOG=info job ckpt-train --repeat 1 --checkpoint-at 1 --dir "$DIR" | grep -E "written to|final|error" || true
du -b "$DIR"/ckpt-*/shard-0.bin
# Cold read: drop the page cache where allowed (root), so the restore reads from the disk.
if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ]; then sync; echo 3 > /proc/sys/vm/drop_caches; echo "(page cache dropped)"; fi
SYNKV_CHECKPOINT_DIR="$DIR" SYNKV_LOG=warn job ckpt-resume --repeat 2 | grep -E "restored checkpoint|final|error" || true

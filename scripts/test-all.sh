#!/usr/bin/env bash
# Runs every test of synkv: formatting, lints, the Rust unit, integration and doc tests (the
# C ABI's C programs and the multi-process dist tests included), the Python package's pytest
# suite and the Perl module's prove suite. This is the README's test command; .ci/run calls
# it. It installs what it needs itself (a Python venv; Debian's PDL and FFI::Platypus; a font
# for the charts).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Incremental compilation only helps rebuilds and doubles the debug target folder: a CI machine
# once ran out of disk here. A developer may set CARGO_INCREMENTAL=1.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
echo "== disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free here"

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

echo "== chart font (Debian's fonts-dejavu-core: the synkv bench --plot tests draw text with it)"
if [[ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf && -z "${SYNKV_PLOT_FONT:-}" ]] && command -v apt-get >/dev/null; then
    sudo=()
    [[ $(id -u) -ne 0 ]] && sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends fonts-dejavu-core >/dev/null 2>&1 ||
        { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq --no-install-recommends fonts-dejavu-core >/dev/null; } ||
        echo "could not install fonts-dejavu-core: the chart tests skip, saying why"
fi

echo "== cargo test"
cargo test --workspace

echo "== chaos (short; a new random seed each run, printed so a failure can be repeated)"
cargo run -q -p synkv-cli -- chaos --kills 3 --rounds 60 --max-secs 300
# 24 keys of 32 KB: each server's 8 rounds completed by one push update side by side
# (partition/batch.rs) and replicate to their backups as a batch while servers die; two
# connections per worker and server (SYNKV_STREAMS=2: a break of either is the server's).
SYNKV_STREAMS=2 cargo run -q -p synkv-cli -- chaos --replicas -s 3 --kills 2 --rounds 60 --keys 24 --key-elems 8192 --max-secs 300
# Over TCP with a split key of 2.4 MB (800 KB parts): pulled answers land straight in the
# outputs (transport/landing.rs), so servers die in the middle of landing replies too.
SYNKV_SHM=0 cargo run -q -p synkv-cli -- chaos --replicas -s 3 --kills 4 --rounds 60 --split-elems 600000 --max-secs 300

echo "== real Open MPI and Slurm (mpirun, srun, sbatch; skipped with a message where they cannot run)"
# The synkv binary the cargo steps above built.
SYNKV_BIN="$PWD/target/debug/synkv" bash scripts/test-mpi.sh
SYNKV_BIN="$PWD/target/debug/synkv" bash scripts/test-slurm.sh

echo "== emulated cluster in network namespaces (benches/netns/cluster.py --check; skipped with a message without root)"
python3 benches/netns/cluster.py --check --synkv "$PWD/target/debug/synkv"

echo "== Kubernetes manifests (deploy/k8s: each pod's env, then the pods' command run here)"
python3 scripts/test-k8s.py "$PWD/target/debug/synkv"

echo "== python (pytest)"
bash scripts/test-python.sh

echo "== perl (prove)"
bash scripts/test-perl.sh

echo "== done; the target folder holds $(du -sh target 2>/dev/null | cut -f1)"

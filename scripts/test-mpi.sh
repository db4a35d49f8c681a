#!/usr/bin/env bash
# Runs synkv under a real Open MPI (issue 14): `mpirun -n 2` and `-n 3` of
# `synkv selftest dist t24`, and the same through `synkv launch --launcher mpi`. Each process
# finds its rank from OMPI_COMM_WORLD_* alone; rank 0 hosts the scheduler, SYNKV_NUM_SERVERS
# processes (default: one per node, here 1) host a server (docs/dist-env.md). The script checks
# every process's exit status and its "selftest t24 ok (rank R of N workers, S servers)" line.
#
# Installs Debian's openmpi-bin when mpirun is missing (as root); skips with a message when it
# cannot. Every run is bounded. SYNKV_BIN: the synkv binary (default: cargo's debug build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ENGINE=mpi
# shellcheck source=scripts/engines-common.sh
source scripts/engines-common.sh

if ! command -v mpirun >/dev/null 2>&1; then
    [[ $(id -u) == 0 ]] || skip "mpirun is missing and installing openmpi-bin needs root"
    ensure_packages mpirun openmpi-bin || skip "could not install Debian's openmpi-bin"
fi
SYNKV=$(synkv_bin)   # before clean_job_env, which unsets SYNKV_BIN too
clean_job_env
dir=$(mktemp -d /tmp/synkv-mpi.XXXXXX)
trap 'rm -rf "$dir"' EXIT

# Open MPI refuses root without this flag; the machine has fewer cores than processes.
# The job's secret, passed by name (-x), as docs/deploying.md tells.
SYNKV_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export SYNKV_SECRET
mpi=(mpirun --oversubscribe --tag-output -x SYNKV_SECRET)
if [[ $(id -u) == 0 ]]; then mpi+=(--allow-run-as-root); fi

run() { # NAME N S OUT CMD...: runs CMD bounded and checks the t24 lines.
    local name=$1 n=$2 s=$3 out=$4 st=0
    shift 4
    timeout 150 "$@" >"$out" 2>&1 </dev/null || st=$?
    check_t24 "$name" "$st" "$out" "$n" "$s"
}

# The scheduler's port: SYNKV_ROOT_PORT (Open MPI gives no port; the default 29600 may be busy).
run "mpirun -n 2 synkv selftest dist t24" 2 1 "$dir/n2.out" \
    "${mpi[@]}" -n 2 -x SYNKV_ROOT_PORT="$(free_port)" "$SYNKV" selftest dist t24
run "mpirun -n 3 synkv selftest dist t24" 3 1 "$dir/n3.out" \
    "${mpi[@]}" -n 3 -x SYNKV_ROOT_PORT="$(free_port)" "$SYNKV" selftest dist t24
run "mpirun -n 3 (SYNKV_NUM_SERVERS=2) synkv selftest dist t24" 3 2 "$dir/n3s2.out" \
    "${mpi[@]}" -n 3 -x SYNKV_ROOT_PORT="$(free_port)" -x SYNKV_NUM_SERVERS=2 "$SYNKV" selftest dist t24

# synkv launch --launcher mpi: the dry run's command line, then a real run.
"$SYNKV" launch --launcher mpi -n 3 -s 2 --root-port 4321 --launcher-arg=--oversubscribe --dry-run -- "$SYNKV" selftest dist t24 >"$dir/dry.out" 2>&1 || true
root_flag=""
if [[ $(id -u) == 0 ]]; then root_flag=" --allow-run-as-root"; fi
check_contains "synkv launch --launcher mpi --dry-run" "$dir/dry.out" \
    "mpirun -n 3$root_flag -x SYNKV_NUM_SERVERS=2 -x SYNKV_ROOT_PORT=4321 -x SYNKV_HEARTBEAT_INTERVAL_MS" \
    " --oversubscribe $SYNKV selftest dist t24"
# Without SYNKV_SECRET: the launcher generates the job's secret itself.
run "synkv launch --launcher mpi -n 3 -s 2" 3 2 "$dir/launch.out" \
    env -u SYNKV_SECRET "$SYNKV" launch --launcher mpi -n 3 -s 2 --root-port "$(free_port)" --launcher-arg=--oversubscribe -- "$SYNKV" selftest dist t24

finish

#!/usr/bin/env bash
# Runs synkv under a real Slurm (issue 14): starts a one-node Slurm cluster (Debian's
# slurmctld + slurmd, auth/none, everything in a temp dir, free ports) and runs
# `synkv selftest dist t24` as 2-task jobs with `srun`, with `sbatch --wait`, and through
# `synkv launch --launcher slurm`. Each task finds its rank, the scheduler (hosted by task 0)
# and its server from Slurm's variables alone (docs/dist-env.md); the script checks every
# task's exit status and its "selftest t24 ok (rank R of 2 workers, S servers)" line.
#
# Needs root (the daemons run as root and apt-get installs slurm-wlm); skips with a message
# when not root or when Slurm cannot be installed or started. Every wait is bounded.
# SYNKV_BIN: the synkv binary (default: cargo's debug build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ENGINE=slurm
# shellcheck source=scripts/engines-common.sh
source scripts/engines-common.sh

[[ $(id -u) == 0 ]] || skip "needs root to start slurmctld and slurmd"
ensure_packages slurmd slurm-wlm slurmctld slurmd slurm-client || skip "could not install Debian's slurm-wlm"
for p in slurmctld slurmd srun sbatch sinfo; do
    command -v "$p" >/dev/null || skip "$p is missing after installing slurm-wlm"
done
SYNKV=$(synkv_bin)   # before clean_job_env, which unsets SYNKV_BIN too
clean_job_env

dir=$(mktemp -d /tmp/synkv-slurm.XXXXXX)
host=$(hostname -s)
ctld_port=$(free_port)
d_port=$(free_port)
while [[ "$d_port" == "$ctld_port" ]]; do d_port=$(free_port); done
mkdir -p "$dir/state" "$dir/spool"
# CPUs=4 on a smaller machine: config_overrides makes slurmd take the configured count, so
# 2 (or 3) tasks fit on one node.
cat >"$dir/slurm.conf" <<EOF
ClusterName=synkvtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP
EOF
export SLURM_CONF=$dir/slurm.conf

pids=()
cleanup() {
    local p
    # Jobs still running (a run cut by its timeout) end with the daemons' help, then the daemons.
    timeout 10 scancel --user=root >/dev/null 2>&1 || true
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do timeout 10 tail --pid="$p" -f /dev/null 2>/dev/null || kill -9 "$p" 2>/dev/null || true; done
    if [[ "${KEEP_SLURM_DIR:-}" != 1 ]]; then rm -rf "$dir"; fi
}
trap cleanup EXIT

slurm_logs() {
    echo "---- slurmctld.log"
    tail -20 "$dir/slurmctld.log" 2>/dev/null || true
    echo "---- slurmd.log"
    tail -20 "$dir/slurmd.log" 2>/dev/null || true
}

slurmctld -D -i -f "$dir/slurm.conf" >"$dir/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$dir/slurm.conf" >"$dir/slurmd.out" 2>&1 &
pids+=($!)
if ! timeout 60 bash -c 'until sinfo -h -N -o %t 2>/dev/null | grep -qx idle; do sleep 1; done'; then
    cat "$dir/slurmctld.out" "$dir/slurmd.out" || true
    slurm_logs
    sinfo -N -l || true
    skip "the one-node Slurm cluster did not come up within 60 s (log above)"
fi
echo "one-node Slurm cluster up: $host, slurmctld port $ctld_port, slurmd port $d_port ($SLURM_CONF)"

# The job's secret, as docs/deploying.md tells (srun passes the environment on): the
# scheduler listens on the node's name, which needs one.
SYNKV_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export SYNKV_SECRET

# 1. srun -n 2: one node, so one server (the default: one per node), hosted by task 0.
st=0
timeout 150 srun -n 2 -t 3 --label --kill-on-bad-exit=1 "$SYNKV" selftest dist t24 >"$dir/srun2.out" 2>&1 </dev/null || st=$?
check_t24 "srun -n 2 synkv selftest dist t24" "$st" "$dir/srun2.out" 2 1

# 2. srun -n 3 with SYNKV_NUM_SERVERS=2 (tasks 0 and 1 host a server).
st=0
timeout 150 srun -n 3 -t 3 --label --kill-on-bad-exit=1 --export=ALL,SYNKV_NUM_SERVERS=2 "$SYNKV" selftest dist t24 >"$dir/srun3.out" 2>&1 </dev/null || st=$?
check_t24 "srun -n 3 (SYNKV_NUM_SERVERS=2) synkv selftest dist t24" "$st" "$dir/srun3.out" 3 2

# 3. sbatch --wait of a script that runs the job step with srun.
cat >"$dir/job.sh" <<EOF
#!/bin/bash
#SBATCH -n 2
#SBATCH -t 3
#SBATCH -o $dir/batch.out
srun --label "$SYNKV" selftest dist t24
EOF
st=0
timeout 150 sbatch --wait "$dir/job.sh" >"$dir/sbatch.out" 2>&1 </dev/null || st=$?
cat "$dir/sbatch.out" >>"$dir/batch.out" 2>/dev/null || true
check_t24 "sbatch --wait (srun synkv selftest dist t24)" "$st" "$dir/batch.out" 2 1

# 4. synkv launch --launcher slurm: the dry run's command line, then a real run.
"$SYNKV" launch --launcher slurm -n 3 -s 2 --root-port 4321 --launcher-arg=--label --dry-run -- "$SYNKV" selftest dist t24 >"$dir/dry.out" 2>&1 || true
check_contains "synkv launch --launcher slurm --dry-run" "$dir/dry.out" \
    "srun -n 3 --export=ALL,SYNKV_NUM_SERVERS=2,SYNKV_ROOT_PORT=4321 --label $SYNKV selftest dist t24"
st=0
# Without SYNKV_SECRET: the launcher generates the job's secret itself.
timeout 150 env -u SYNKV_SECRET "$SYNKV" launch --launcher slurm -n 2 -s 2 --launcher-arg=--label --launcher-arg=-t3 -- "$SYNKV" selftest dist t24 >"$dir/launch.out" 2>&1 </dev/null || st=$?
check_t24 "synkv launch --launcher slurm -n 2 -s 2" "$st" "$dir/launch.out" 2 2

if ((FAILED)); then slurm_logs; fi
finish

#!/usr/bin/env bash
# One timed training run on this node, printed as the reference prints it (spec §3.2):
#   STARTING TIMING RUN AT <date>  ...training...  ENDING TIMING RUN AT <date>
#   RESULT,IMAGE_CLASSIFICATION,,<seconds>,<user>,<start date>
# RESULT is wall time including initialisation, not the MLPerf score (run_start..run_stop in the log). A failed
# run exits with training's exit code and prints no ENDING/RESULT.
#
# Usage: source config/<SYSTEM>.sh; DATADIR=<folder with train.rec/.idx, val.rec/.idx> ./run_and_time.sh
#
# Settings travel in the environment: rn50_mx/config.py reads the reference's names (BATCHSIZE, LR, DALI_THREADS,
# ...; `python -m rn50_mx.train --help` shows each flag with its variable), so this script maps none of them to
# flags a second time and sets no defaults. It passes only what it decides itself, the data files. Each run
# starts by printing every resolved setting, one per line, with where it came from.
#
# Processes: one per device, DGXNGPU on this node.
#   under srun (SLURM_LOCALID set): Slurm started one task per device; this task is one rank.
#   DGXNGPU > 1: horovodrun -np DGXNGPU -H localhost:DGXNGPU, which uses mpirun when Horovod was built with
#     MPI (the NGC image) and Gloo otherwise.
#   DGXNGPU = 1: the process directly.
# With several ranks, each is bound to its share of the physical cores and their NUMA node by numactl, as
# the reference's bind.sh --cpu=exclusive did; without numactl the ranks run unbound.
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")

# --- one rank: bind it, then exec the training command ------------------------------------------------------

local_rank() {
    echo "${SLURM_LOCALID:-${OMPI_COMM_WORLD_LOCAL_RANK:-${HOROVOD_LOCAL_RANK:-${LOCAL_RANK:-0}}}}"
}

# numactl options giving rank $1 of $2 on this node an equal run of physical cores (with their hyperthread
# siblings) and its NUMA node's memory; prints nothing when there are fewer cores than ranks.
# On the NF5688M6 (64 cores, 128 CPUs) rank 0 gets CPUs 0-7 and 64-71 and --membind=0, as in its log.
numa_options() {
    lscpu -p=CPU,CORE,NODE | awk -F, -v rank="$1" -v ranks="$2" '
        /^#/ { next }
        !($2 in node) { order[n++] = $2; node[$2] = ($3 == "" ? 0 : $3) }
        { cpus[$2] = (seen[$2]++ ? cpus[$2] "," : "") $1 }
        END {
            per = int(n / ranks)
            if (per < 1) exit
            for (i = rank * per; i < (rank + 1) * per; i++) list = (list == "" ? "" : list ",") cpus[order[i]]
            printf "--physcpubind=%s --membind=%s\n", list, node[order[rank * per]]
        }'
}

run_rank() {
    local rank options
    rank=$(local_rank)
    if ! command -v numactl >/dev/null; then
        [[ "$rank" != 0 ]] || echo "run_and_time.sh: numactl not found: ranks run without CPU binding" >&2
        exec "$@"
    fi
    options=$(numa_options "$rank" "$DGXNGPU")
    # shellcheck disable=SC2086  # $options is a list of numactl flags
    if [[ -n "$options" ]] && numactl $options true >/dev/null 2>&1; then
        echo "rank $rank: numactl $options"
        exec numactl $options "$@"
    fi
    echo "run_and_time.sh: rank $rank runs without CPU binding (${options:-fewer cores than ranks})" >&2
    exec "$@"
}

if [[ "${1:-}" == "--rank" ]]; then
    shift
    run_rank "$@"
fi

# --- the timed run ---------------------------------------------------------------------------------------

: "${DATADIR:?set DATADIR to the folder holding train.rec/.idx and val.rec/.idx}"
: "${DGXNGPU:?source a config/<SYSTEM>.sh first (DGXNGPU is unset)}"
# Only global rank 0 prints the timing lines and the settings (srun runs this script once per task).
[[ "${SLURM_PROCID:-0}" == 0 ]] && leader=1 || leader=0
say() { if [[ "$leader" == 1 ]]; then echo "$@"; fi; }

start=$(date +%s)
start_fmt=$(date +%Y-%m-%d\ %r)
say "STARTING TIMING RUN AT ${start_fmt}"

PARAMS=(
    --data-train "${DATADIR}/train.rec"
    --data-val "${DATADIR}/val.rec"
)
# A bad setting stops here, before any rank starts, with one line naming the variable.
# Under srun every task runs this script: only the leader checks, the job already checked before it started.
if [[ "$leader" == 1 ]]; then
    settings=$(python -m rn50_mx.config --check "${PARAMS[@]}")
    echo "${settings}"
fi

TRAIN=(python -m rn50_mx.train "${PARAMS[@]}")
if [[ -n "${SLURM_LOCALID:-}" ]]; then
    LAUNCH=(bash "$SELF" --rank "${TRAIN[@]}")
elif (( DGXNGPU > 1 )); then
    LAUNCH=(horovodrun -np "$DGXNGPU" -H "localhost:${DGXNGPU}" bash "$SELF" --rank "${TRAIN[@]}")
else
    LAUNCH=("${TRAIN[@]}")
fi
# In the background, so that a SIGTERM or Ctrl-C reaching this script is passed on (horovodrun then stops every
# rank) instead of leaving the ranks running without a parent. horovodrun tags every line with its rank
# ("[3]<stdout>:"); MLPerf log lines must start with ":::MLLOG", so the tag is taken off those.
"${LAUNCH[@]}" > >(sed -u -E 's/^\[[0-9,]+\]<std(out|err)>:(:::MLLOG )/\2/') &
launcher=$!
trap 'kill -TERM "$launcher" 2>/dev/null' TERM INT
status=0
wait "$launcher" || status=$?
while kill -0 "$launcher" 2>/dev/null; do  # a trapped signal ends `wait` early: wait for the launcher to stop
    wait "$launcher" || status=$?
done
trap - TERM INT
wait  # the log filter, so that its last lines come before ENDING/RESULT
if (( status != 0 )); then
    echo "run_and_time.sh: training failed with exit code ${status}" >&2
    exit "$status"
fi

end=$(date +%s)
say "ENDING TIMING RUN AT $(date +%Y-%m-%d\ %r)"
say "RESULT,IMAGE_CLASSIFICATION,,$((end - start)),${USER:-},${start_fmt}"

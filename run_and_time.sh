#!/usr/bin/env bash
# One timed training run on this node, printed as the reference prints it (run_and_time.sh):
#   STARTING TIMING RUN AT <date>  ...training...  ENDING TIMING RUN AT <date>
#   RESULT,IMAGE_CLASSIFICATION,,<seconds>,<user>,<start date>
# RESULT is wall time including initialisation, not the MLPerf score (run_start..run_stop in the log).
# The outcome comes from this run's MLPerf lines, not from the exit code alone:
#   run_stop status success    success (exit 0), even when a process then hung on its way out and was ended by
#                              its exit alarm (horovodrun then exits 1)
#   resumable_stop             stopped after writing a checkpoint (SIGTERM/SIGUSR1): exit 75, "stopped, resumable"
#   diverged                   training stopped on a diverged loss (run_stop aborted): exit 78, "the loss diverged"
#   run_stop aborted           the target was not reached: exit 1, "a trial that did not converge"
#   anything else              failed: training's exit code (1 when it was 0); no ENDING/RESULT lines
# The codes are rn50_mx/exit_codes.sh's.
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
# With several ranks, each is bound by numactl to a share of the physical cores and the memory of its GPU's NUMA
# node (the reference's bind.sh --cpu=exclusive bound by rank order); without numactl the ranks run unbound.
set -euo pipefail

SELF=$(readlink -f -- "${BASH_SOURCE[0]}")
LAUNCHER=run_and_time.sh
# shellcheck source=rn50_mx/launch.sh
source "${SELF%/*}/rn50_mx/launch.sh"

# --- one rank: bind it, then exec the training command ------------------------------------------------------

local_rank() {
    echo "${SLURM_LOCALID:-${OMPI_COMM_WORLD_LOCAL_RANK:-${HOROVOD_LOCAL_RANK:-${LOCAL_RANK:-0}}}}"
}

# numactl options giving rank $1 of $2 on this node the physical cores (with their hyperthread siblings) and the
# memory node next to its GPU, or an equal slice of all cores in rank order where the GPU's place is unknown;
# prints nothing when there are fewer cores than ranks (rn50_mx/bind.py). On the NF5688M6 (64 cores, 128 CPUs)
# rank 0 gets CPUs 0-7 and 64-71 and --membind=0, as in its log; on a DGX A100, GPUs 0 and 1 share NUMA node 3.
# NUMA_SYSFS_ROOT: where sysfs is (/sys; the tests give a fake tree).
numa_options() {
    python -m rn50_mx.bind "$1" "$2" --visible "${CUDA_VISIBLE_DEVICES:-}" --sysfs "${NUMA_SYSFS_ROOT:-/sys}"
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

# Run on its own (not by a launcher, which ties it already), nothing it starts outlives it (rn50_mx/launch.sh).
[[ -n "${RN50MX_LAUNCH:-}" ]] || tie_launch "" "$@"

: "${DATADIR:?set DATADIR to the folder holding train.rec/.idx and val.rec/.idx}"
: "${DGXNGPU:?source a config/<SYSTEM>.sh first (DGXNGPU is unset)}"
# Only global rank 0 prints the timing lines and the settings (srun runs this script once per task).
[[ "${SLURM_PROCID:-0}" == 0 ]] && leader=1 || leader=0
say() { if [[ "$leader" == 1 ]]; then echo "$@"; fi; }

DATADIR=$(absolute DATADIR)  # a name that starts with '-' is no flag of the training's
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
    settings=$(python -m rn50_mx.check "${PARAMS[@]}")
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
# ("[3]<stdout>:"; through mpirun "[1,3]<stdout>:", which also tags each 4 KB chunk it reads, mid-line in a burst
# of lines); MLPerf log lines must start with ":::MLLOG" and hold none, so every tag is taken off those.
# The stream is also kept in a temporary file, from which this run's outcome is read.
stream=$(mktemp)
trap 'rm -f "$stream"' EXIT
# The filter ignores SIGUSR1 (Slurm's --signal reaches it too), SIGTERM and SIGINT: it writes the ranks' lines until
# they end (their checkpoint's on a signal), and this script waits for it; to the stream file still when this
# script's reader has gone (tee -p: a terminal's `| tee` ended by Ctrl-C). The launcher runs in a process group of its
# own (set -m), so that a signal to this script's group (the trial loop's stop, a Ctrl-C) reaches it once, from
# stop_launcher below, as in a container: a second SIGTERM ends a rank at once, before its checkpoint.
exec {to_filter}> >(trap '' USR1 TERM INT; sed -u -E '/^(\[[0-9,]+\]<std(out|err)>:)?:::MLLOG /s/\[[0-9,]+\]<std(out|err)>://g' |
                    tee -p "$stream")
filter=$!
# horovodrun with MPI (the NGC image's; here too) runs mpirun under `/bin/sh -c`, which does not pass a signal on.
# mpirun gets SIGUSR1, which it passes to every rank (its SIGTERM kills them a second later, odls_base_sigkill_timeout):
# a rank stops at a checkpoint on SIGUSR1 as on SIGTERM, and without a checkpoint folder it ends at once.
# Trapped before the launcher starts: a stop that comes as it starts is passed on once its pid is known.
launcher="" stop_asked=0
stop_launcher() {
    local pid
    stop_asked=1
    [[ -n "$launcher" ]] || return 0
    for pid in $(pgrep -P "$launcher") "$launcher"; do
        if [[ "$(ps -o comm= -p "$pid")" == mpirun ]]; then kill -USR1 "$pid"; else kill -TERM "$pid"; fi
    done 2>/dev/null || true
}
trap stop_launcher TERM INT
# Slurm's --signal=USR1 (run.sub) reaches every process of the step, this script too: the ranks write a checkpoint and
# stop (RN50_CHECKPOINT_DIR), and this script, which would die of it, waits for them and reads the outcome.
trap ':' USR1
set -m
"${LAUNCH[@]}" >&"$to_filter" &
launcher=$!
set +m
exec {to_filter}>&-
(( stop_asked == 0 )) || stop_launcher
# A trapped signal ends `wait` early (status 128 + the signal): wait until the launcher has ended, then take its own
# status, which bash keeps for a pid it has reaped.
wait "$launcher" || true
while kill -0 "$launcher" 2>/dev/null; do wait "$launcher" || true; done
status=0
wait "$launcher" || status=$?
# The filter's last lines come before the outcome is read from them, and before ENDING/RESULT.
while kill -0 "$filter" 2>/dev/null; do wait "$filter" || true; done
trap - TERM INT USR1

# This run's outcome, from its MLPerf lines and the training's status (rn50_mx/launch.sh's run_outcome), said in one
# line and given as the exit status: 75, 78 and 79 only with their lines (a training that exits 75 without writing
# its checkpoint has failed).
if [[ "$leader" == 1 ]]; then
    lines=$(mllog_lines "$stream")
    outcome=$(run_outcome "$status" "$lines")
    stopped_as=$(mllog_value "$lines" run_stop)
    case "$outcome" in
        resumable) echo "run_and_time.sh: stopped, resumable (checkpoint $(mllog_value "$lines" resumable_stop))" >&2 ;;
        diverged) echo "run_and_time.sh: the loss diverged ($(mllog_value "$lines" diverged)): the settings that set" \
                       "the step size do not train; training stopped there (run_stop aborted)" >&2 ;;
        stalled) echo "run_and_time.sh: training stalled ($(mllog_value "$lines" stalled)): a rank made no progress;" \
                      "training stopped there (run_stop aborted)" >&2 ;;
        missed) echo "run_and_time.sh: the run ended without reaching the target (run_stop aborted): a trial that" \
                     "did not converge" >&2 ;;
        success) if [[ "$status" != 0 ]]; then
            echo "run_and_time.sh: training exited with code ${status} after run_stop success (a process hung on its" \
                 "way out and was ended by its exit alarm): the run is complete" >&2
        fi ;;
        failed)
            echo "run_and_time.sh: training failed (exit code ${status}; run_stop ${stopped_as:-missing})" >&2
            if claims_outcome "$status"; then status=1; fi ;;  # 0, 75, 78 or 79 without its line
    esac
    [[ "$outcome" == failed ]] || status=$(outcome_status "$outcome")
    (( status == 0 )) || exit "$status"
elif (( status == 142 )); then  # another task under srun: 128 + SIGALRM, the exit alarm after run_stop
    status=0
elif (( status == RESUMABLE_EXIT || status == DIVERGED_EXIT || status == STALLED_EXIT )); then  # another task under
    exit "$status"                                     # srun, stopped with the leader (which says why; the loop checks)
fi
if (( status != 0 )); then
    echo "run_and_time.sh: training failed with exit code ${status}" >&2
    exit "$status"
fi

end=$(date +%s)
say "ENDING TIMING RUN AT $(date +%Y-%m-%d\ %r)"
say "RESULT,IMAGE_CLASSIFICATION,,$((end - start)),${USER:-},${start_fmt}"

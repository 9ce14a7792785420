#!/usr/bin/env bash
# NEXP timed runs on one node (MLPerf scores 5), each after a page-cache drop, each logged to
# LOGDIR/<DATESTAMP>_<i>.log, then the timing summary of those logs (spec §3.1):
#   source config/NF5688M6.sh
#   CONT=<image built from ./Dockerfile> DATADIR=/raid/imagenet-rec LOGDIR=$PWD/results ./run_with_docker.sh
# With CONT set, each trial runs run_and_time.sh in a fresh container with all GPUs, the host's IPC and network,
# DATADIR mounted at /data and LOGDIR at /results. Without CONT it runs on this machine, DATADIR as it is, with
# `python` and `horovodrun` from PATH: the CPU path of `make demo` and CI.
#
# DGXSYSTEM  set by the config; its config/<DGXSYSTEM>.sh names the variables handed to the container, with
#            the values they have here (so an export after sourcing the config is an override)
# DATADIR    folder with train.rec/.idx and val.rec/.idx (required)
# LOGDIR     where the logs go (default ./results);  NEXP  number of trials (default 5)
# SEED       trial i uses SEED+i-1; unset, each trial draws a different random seed. The seed checker refuses
#            two runs with the same seed, so trials never repeat one.
# CLEAR_CACHES  1 (default): drop the page cache before each trial; 0: don't. Training logs cache_clear as
#            true only when the drop really happened.
set -euo pipefail

HERE=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")

die() { echo "run_with_docker.sh: $*" >&2; exit 2; }

: "${DGXSYSTEM:?source a config/<SYSTEM>.sh first}"
: "${DATADIR:?set DATADIR to the folder holding train.rec/.idx and val.rec/.idx}"
CONFIG="${HERE}/config/${DGXSYSTEM}.sh"
[[ -f "$CONFIG" ]] || die "DGXSYSTEM=${DGXSYSTEM}: no ${CONFIG}"
NEXP=${NEXP:-5}
[[ "$NEXP" =~ ^[1-9][0-9]*$ ]] || die "NEXP=${NEXP}: expected a positive integer"
LOGDIR=${LOGDIR:-$PWD/results}
DATESTAMP=${DATESTAMP:-$(date +%y%m%d%H%M%S%N)}
CLEAR_CACHES=${CLEAR_CACHES:-1}
for file in train.rec train.idx val.rec val.idx; do
    [[ -f "${DATADIR}/${file}" ]] || die "DATADIR=${DATADIR}: no ${file} (pack it with python -m rn50_mx.prep_rec)"
done
mkdir -p "$LOGDIR"
DATADIR=$(readlink -f "$DATADIR")
LOGDIR=$(readlink -f "$LOGDIR")

# The container gets the variables the config exports (as the reference computes them) plus the launcher's own.
# shellcheck disable=SC2016  # $1 is expanded by the inner bash
mapfile -t CONFIG_VARS < <(env -i bash -c 'source "$1" && compgen -e' _ "$CONFIG" | grep -vxE 'PWD|SHLVL|_|OLDPWD')
ENV_ARGS=()
for name in "${CONFIG_VARS[@]}" SEED CACHE_CLEARED; do
    ENV_ARGS+=(--env "$name")
done
ENV_ARGS+=(--env DATADIR=/data)
DOCKER_RUN=(
    docker run --rm --init --gpus all --net=host --uts=host --ipc=host --security-opt seccomp=unconfined
    --ulimit stack=67108864 --ulimit memlock=-1
    -v "${DATADIR}:/data" -v "${LOGDIR}:/results" "${ENV_ARGS[@]}"
)

# Runs a command on this machine, or in the container when CONT is set.
run() {
    if [[ -n "${CONT:-}" ]]; then
        "${DOCKER_RUN[@]}" "$CONT" "$@"
    else
        "$@"
    fi
}

# Drops the page cache so that each trial reads the data from disk (MLPerf rules); fails when not permitted.
drop_caches() {
    if [[ "$CLEAR_CACHES" != 1 ]]; then
        echo "Not clearing the page cache (CLEAR_CACHES=${CLEAR_CACHES})"
        return 1
    fi
    sync
    if { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null || sudo -n /sbin/sysctl -q vm.drop_caches=3 2>/dev/null; then
        echo "Cleared the page cache on $(hostname)"
        return 0
    fi
    echo "Could not clear the page cache on $(hostname) (needs root or passwordless sudo): cache_clear is logged false"
    return 1
}

# Fail before any trial on a bad setting: one line naming the variable.
run python -m rn50_mx.config --check >/dev/null

used_seeds=" "  # the seeds of earlier trials
next_seed() {  # $1 = trial number
    local seed
    if [[ -n "${SEED:-}" ]]; then
        seed=$((SEED + $1 - 1))
    else
        seed=$RANDOM
        while [[ "$used_seeds" == *" $seed "* ]]; do seed=$RANDOM; done
    fi
    echo "$seed"
}

logs=()  # as seen here, and from the container
container_logs=()
failed=()
for ((i = 1; i <= NEXP; i++)); do
    seed=$(next_seed "$i")
    used_seeds+="$seed "
    log="${LOGDIR}/${DATESTAMP}_${i}.log"
    logs+=("$log")
    container_logs+=("/results/${DATESTAMP}_${i}.log")
    if ! (
        echo "Beginning trial ${i} of ${NEXP}"
        if drop_caches; then export CACHE_CLEARED=1; else export CACHE_CLEARED=0; fi
        export SEED="$seed"
        if [[ -n "${CONT:-}" ]]; then run ./run_and_time.sh; else run "${HERE}/run_and_time.sh"; fi
    ) |& tee "$log"; then
        failed+=("$i")
    fi
done

echo "Logs: ${logs[*]}"
if [[ -n "${CONT:-}" ]]; then logs=("${container_logs[@]}"); fi
run python -m rn50_mx.timing "${logs[@]}" || echo "run_with_docker.sh: no timing summary" >&2
if (( ${#failed[@]} > 0 )); then
    echo "run_with_docker.sh: trial(s) ${failed[*]} of ${NEXP} failed" >&2
    exit 1
fi

# shellcheck shell=bash
# The trial loop of run_with_docker.sh and run.sub, sourced by both (run_with_docker.sh): NEXP timed runs of
# run_and_time.sh, each after a page-cache drop, with its own seed, logged to LOGDIR/<DATESTAMP>_<i>.log; then the
# timing summary of those logs, and exit status 1 when a trial failed.
#
# The sourcing script runs under `set -euo pipefail`, sets LAUNCHER (its name, for messages), sources this file,
# calls `trial_settings DEFAULT_LOGDIR`, then defines the following and calls `run_trials`:
#   run_trial      runs run_and_time.sh once (SEED and CACHE_CLEARED are exported for it)
#   drop_caches    drops the page cache wherever the trial reads its data; fails when that is not permitted
#   run_tool CMD   runs a one-off command (the settings check, the timing tool) where rn50_mx is installed
#   DATA_SEEN_AS, LOGS_SEEN_AS   DATADIR and LOGDIR as run_tool sees them

say_error() { echo "${LAUNCHER}: $*" >&2; }
die() { say_error "$@"; exit 2; }

# NEXP, LOGDIR (default $1, created), DATESTAMP and CLEAR_CACHES, as the launchers' header comments describe them.
trial_settings() {
    : "${DATADIR:?set DATADIR to the folder holding train.rec/.idx and val.rec/.idx}"
    NEXP=${NEXP:-5}
    [[ "$NEXP" =~ ^[1-9][0-9]*$ ]] || die "NEXP=${NEXP}: expected a positive integer"
    LOGDIR=${LOGDIR:-$1}
    DATESTAMP=${DATESTAMP:-$(date +%y%m%d%H%M%S%N)}
    CLEAR_CACHES=${CLEAR_CACHES:-1}
    mkdir -p "$LOGDIR"
}

# Sources $1's fragment config/<SYSTEM>_tuned.sh (`python -m rn50_mx.tune` writes it) when there is one, as if it
# came right after the config: a variable exported after sourcing the config (its value is not the config's) keeps
# that value, and a line says which values the fragment gave.
source_tuned() {
    local config=$1 tuned=${1%.sh}_tuned.sh name line given=()
    [[ -f "$tuned" ]] || return 0
    local -A as_config=() as_tuned=()
    # shellcheck disable=SC2016  # expanded by the inner bash
    while IFS= read -r -d '' line; do as_config[${line%%=*}]=${line#*=}; done \
        < <(env -i bash -c 'source "$1" && env -0' _ "$config")
    # shellcheck disable=SC2016
    while IFS= read -r -d '' line; do as_tuned[${line%%=*}]=${line#*=}; done \
        < <(env -i bash -c 'source "$1" && source "$2" && env -0' _ "$config" "$tuned")
    for name in "${!as_tuned[@]}"; do
        if [[ "${as_tuned[$name]}" != "${as_config[$name]-}" && "${!name-}" == "${as_config[$name]-}" ]]; then
            export "${name}=${as_tuned[$name]}"
            given+=("${name}=${as_tuned[$name]}")
        fi
    done
    [[ ${#given[@]} -gt 0 ]] || given=("nothing: every value it sets was exported after the config")
    echo "${LAUNCHER}: sourced ${tuned}: ${given[*]}"
}

# Trial $1's seed: SEED+$1-1, or a random one unlike the earlier trials' (" $2 "): the seed checker refuses two
# runs with the same seed.
pick_seed() {
    local seed
    if [[ -n "${SEED:-}" ]]; then
        echo $((SEED + $1 - 1))
        return
    fi
    seed=$RANDOM
    while [[ "$2" == *" $seed "* ]]; do seed=$RANDOM; done
    echo "$seed"
}

# Succeeds only when the page cache really was dropped: training logs cache_clear from CACHE_CLEARED.
clear_caches() {
    if [[ "$CLEAR_CACHES" != 1 ]]; then
        echo "Not clearing the page cache (CLEAR_CACHES=${CLEAR_CACHES})"
        return 1
    fi
    drop_caches
}

run_trials() {
    local i seed used_seeds=" " logs=() seen_logs=() failed=()
    # Fail before any trial on a bad setting or a missing data file: one line naming it.
    run_tool python -m rn50_mx.config --check --data-train "${DATA_SEEN_AS}/train.rec" \
        --data-val "${DATA_SEEN_AS}/val.rec" >/dev/null
    # SELFTEST=1: the self-test of the stack, the config and the data first (README "GPU users"); a failed check
    # stops the launch before any trial.
    if [[ "${SELFTEST:-0}" == 1 ]]; then
        run_tool python -m rn50_mx.selftest --data-train "${DATA_SEEN_AS}/train.rec" \
            --data-val "${DATA_SEEN_AS}/val.rec" || die "the self-test failed (its table says which check): no trial ran"
    fi
    for ((i = 1; i <= NEXP; i++)); do
        seed=$(pick_seed "$i" "$used_seeds")
        used_seeds+="$seed "
        logs+=("${LOGDIR}/${DATESTAMP}_${i}.log")
        seen_logs+=("${LOGS_SEEN_AS}/${DATESTAMP}_${i}.log")
        if ! (
            echo "Beginning trial ${i} of ${NEXP}"
            if clear_caches; then export CACHE_CLEARED=1; else export CACHE_CLEARED=0; fi
            export SEED="$seed"
            run_trial
        ) |& tee "${logs[-1]}"; then
            failed+=("$i")
        fi
    done
    echo "Logs: ${logs[*]}"
    run_tool python -m rn50_mx.timing "${seen_logs[@]}" || say_error "no timing summary"
    if (( ${#failed[@]} > 0 )); then
        say_error "trial(s) ${failed[*]} of ${NEXP} failed"
        exit 1
    fi
}

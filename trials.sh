# shellcheck shell=bash
# The trial loop of run_with_docker.sh and run.sub, sourced by both (run_with_docker.sh): NEXP timed runs of
# run_and_time.sh, each after a page-cache drop, with its own seed, logged to LOGDIR/<DATESTAMP>_<i>.log; then the
# timing summary of those logs, and exit status 1 when a trial failed.
#
# The sourcing script runs under `set -euo pipefail`, sets LAUNCHER (its name, for messages), sources this file (and
# with it rn50_mx/launch.sh: names, tying, locks, outcomes), calls `tie_launch`, `check_names`, `launch_settings
# DEFAULT_LOGDIR` (nothing written yet) and `own_logs`, then defines the following and calls `run_trials`:
#   run_trial      runs run_and_time.sh once (SEED and CACHE_CLEARED are exported for it)
#   drop_caches    drops the page cache wherever the trial reads its data; fails when that is not permitted
#   run_tool CMD   runs a one-off command (the settings check, the timing tool) where rn50_mx is installed
#   DATA_SEEN_AS, LOGS_SEEN_AS   DATADIR and LOGDIR as run_tool sees them
#   RUNS_IMAGE (optional)         the image every trial runs, named in each trial's log and before the summary
#   on_resumable_stop (optional)  called when a trial stopped resumable (exit 75), before the loop exits 75; a stalled
#                                 trial whose checkpoint folder holds a checkpoint is resumable then too
# The exit codes of a trial's outcomes are rn50_mx/exit_codes.sh's; a trial's outcome is read by trial_outcome.
#
# A trial stopped resumable leaves LOGDIR/DATESTAMP.resume (the trial, its seed, the seeds and failures before it): the
# next launch with the same LOGDIR and DATESTAMP (run.sub's requeued job) resumes that trial, its output appended to
# the trial's log (the resumed run finds its checkpoint in RN50_CHECKPOINT_DIR and logs resumed_from), then goes on
# with the trials after it.

# shellcheck source=rn50_mx/launch.sh
source "$(dirname "${BASH_SOURCE[0]}")/rn50_mx/launch.sh"

# NEXP, LOGDIR (default $1), DATESTAMP, CLEAR_CACHES and STOP_GRACE, as the launchers' header comments describe them,
# and DATADIR and LOGDIR made absolute; nothing is written yet. check_names has checked each name.
launch_settings() {
    [[ -n "${DATADIR:-}" ]] || die "DATADIR is not set: set it to the folder holding train.rec/.idx and val.rec/.idx"
    [[ -e "$DATADIR" ]] || die "$(named DATADIR): no such folder"
    [[ -d "$DATADIR" ]] || die "$(named DATADIR): not a folder"
    DATADIR=$(absolute DATADIR)
    NEXP=${NEXP:-5}
    if (( NEXP > 1 )) && [[ -n "${RN50_CHECKPOINT_DIR:-}" ]]; then
        die "NEXP=${NEXP} with $(named RN50_CHECKPOINT_DIR): the trials would share one checkpoint folder, and each" \
            "after the first would find the first's ended run; give one folder per trial (NEXP=1)"
    fi
    LOGDIR=${LOGDIR:-$1}
    [[ ! -e "$LOGDIR" || -d "$LOGDIR" ]] || die "$(named LOGDIR): there, but not a folder"
    LOGDIR=$(absolute LOGDIR)
    DATESTAMP=${DATESTAMP:-$(date +%y%m%d%H%M%S%N)}
    CLEAR_CACHES=${CLEAR_CACHES:-1}
    STOP_GRACE=${STOP_GRACE:-120}
}

# The logs, checked before any trial: LOGDIR created and writable, no log of this DATESTAMP there (a log is never
# replaced), no symlink, folder or FIFO at a name the launcher writes (check_log_names), and LOGDIR/DATESTAMP.lock held
# (hold_lock) until the launcher ends, so that a second launch with the same DATESTAMP stops with one line.
own_logs() {
    mkdir -p -- "$LOGDIR" 2>/dev/null || die "$(named LOGDIR): cannot create it"
    LOG_LOCK="${LOGDIR}/${DATESTAMP}.lock"
    RESUME_STATE="${LOGDIR}/${DATESTAMP}.resume"
    refuse_special "$LOG_LOCK"
    refuse_special "$RESUME_STATE"
    hold_lock "$LOG_LOCK" || case $? in
        1) die "$(named LOGDIR): another launch is writing the logs of $(named DATESTAMP) now" ;;
        *) die "$(named LOGDIR): not writable (the logs could not be kept)" ;;
    esac
    trap 'rm -f -- "$LOG_LOCK"' EXIT
    resume_trial=0 resume_seed=0 used_seeds=" " failed=()  # the trial loop's state, unless a stopped trial resumes
    if [[ -f "$RESUME_STATE" ]]; then
        read_resume_state
    elif logs_there; then
        die "$(named LOGDIR): holds logs of $(named DATESTAMP) already; they are kept (choose another DATESTAMP)"
    fi
    check_log_names
}

# Whether LOGDIR holds a log of DATESTAMP, in any form: DATESTAMP_<number>.log exactly (DATESTAMP a's logs are not
# a_1's), LOGDIR and DATESTAMP quoted, so that only the suffix is a pattern (LOGDIR=.../run[1] names its own folder).
logs_there() {
    local path
    for path in "$LOGDIR/$DATESTAMP"_*.log; do
        if [[ "${path#"$LOGDIR/$DATESTAMP"}" =~ ^_[0-9]+\.log$ && ( -e "$path" || -L "$path" ) ]]; then return 0; fi
    done
    return 1
}

# Dies when $1 is there as anything but a regular file (a symlink, a folder, a FIFO): the launcher writes that name,
# and a link planted there would send the write to its target (run.sub's DATESTAMP, the job id, is predictable).
refuse_special() {
    if [[ -L "$1" || ( -e "$1" && ! -f "$1" ) ]]; then
        die "$(named LOGDIR): $(shown "${1##*/}") there is a symlink, folder or other non-regular file; the launcher" \
            "writes that name: remove it"
    fi
}

# Before any trial, the logs the trials will write: the resumed trial's may be there (a regular file, appended to),
# each later one must not be there in any form.
check_log_names() {
    local i log
    for ((i = resume_trial > 0 ? resume_trial : 1; i <= NEXP; i++)); do
        log="${LOGDIR}/${DATESTAMP}_${i}.log"
        refuse_special "$log"
        if (( i != resume_trial )) && [[ -e "$log" ]]; then
            die "$(named LOGDIR): $(shown "${log##*/}") is there already, though its trial is still to run; it is kept"
        fi
    done
}

# Creates trial log $1, empty, failing when anything is at that name (noclobber: O_EXCL, which no symlink passes).
create_log() {
    ( set -o noclobber; : >"$1" ) 2>/dev/null || die "$(named LOGDIR): cannot create $(shown "${1##*/}") (it" \
        "appeared, or LOGDIR is not writable); no further trial runs"
}

# Trial $1 (seed $2) stopped resumable: what the next launch needs to resume it (the trial loop's own variables), as
# data: read_resume_state takes these four lines of numbers and nothing else.
stopped_resumable() {
    local seeds tmp
    read -r -a seeds <<<"$used_seeds"
    # mktemp creates its name exclusively (O_EXCL): no planted link at a fixed temporary name is followed.
    if ! { tmp=$(mktemp -- "${RESUME_STATE}.XXXXXX") && printf 'resume_trial=%d\nresume_seed=%d\nused_seeds=%s\nfailed=%s\n' \
               "$1" "$2" "${seeds[*]}" "${failed[*]}" >"$tmp" && mv -T -- "$tmp" "$RESUME_STATE"; } 2>/dev/null; then
        rm -f -- "${tmp:-}"
        say_error "cannot write $(shown "$RESUME_STATE"): a later launch starts the trials anew"
    fi
}

# The state stopped_resumable wrote, read as data (never run: a results folder is often shared and mounted into the
# container): resume_trial and resume_seed a number each, used_seeds and failed numbers separated by spaces; any other
# line, or a trial above NEXP, is one line.
read_resume_state() {
    local line key value n=0 state
    state=$(shown "$RESUME_STATE")
    while IFS= read -r line || [[ -n "$line" ]]; do
        n=$((n + 1))
        key=${line%%=*} value=${line#*=}
        case "$key" in
            resume_trial|resume_seed) [[ "$line" == *=* && "$value" =~ ^[0-9]{1,10}$ ]] ;;
            used_seeds|failed) [[ "$line" == *=* && "$value" =~ ^[0-9\ ]*$ ]] ;;
            *) false ;;
        esac || die "${state}: line ${n} is not the launcher's state ($(shown "${line:0:60}"));" \
            "remove the file to start the trials anew"
        case "$key" in
            resume_trial) resume_trial=$((10#$value)) ;;
            resume_seed) resume_seed=$((10#$value)) ;;
            used_seeds) used_seeds=" ${value} " ;;
            failed) read -r -a failed <<<"$value" ;;
        esac
    done <"$RESUME_STATE"
    (( resume_trial >= 1 && resume_trial <= NEXP )) || \
        die "${state}: resumes trial ${resume_trial}, not one of NEXP=${NEXP}; remove the file to" \
            "start the trials anew"
}

# Sources $1's fragments, config/<SYSTEM>_tuned.sh (`python -m rn50_mx.tune` writes it) then
# config/<SYSTEM>_hparams.sh (`python -m rn50_mx.search`), those there are, as if they came right after the config: a
# variable exported after sourcing the config (its value is not the config's) keeps that value, and a line per
# fragment says which values it gave. FRAGMENTS=0 (the search's launcher trials, which export every value): none.
source_fragments() {
    local sourced=("$1") fragment
    case "${FRAGMENTS:-1}" in
        1) ;;
        0) echo "${LAUNCHER}: FRAGMENTS=0: no config fragment sourced"; return ;;
        *) die "$(named FRAGMENTS): expected 1 (source the config's fragments, the default) or 0" ;;
    esac
    for fragment in "${1%.sh}_tuned.sh" "${1%.sh}_hparams.sh"; do
        [[ -f "$fragment" ]] || continue
        source_fragment "$fragment" "${sourced[@]}"
        sourced+=("$fragment")
    done
}

# Exports what fragment $1 sets on top of the files before it ($2...), where the variable still has the value those
# files give it (a value exported after sourcing the config wins), and says which.
source_fragment() {
    local fragment=$1 name line given=()
    shift
    local -A before=() after=()
    while IFS= read -r -d '' line; do before[${line%%=*}]=${line#*=}; done < <(sourced_env "$@")
    while IFS= read -r -d '' line; do after[${line%%=*}]=${line#*=}; done < <(sourced_env "$@" "$fragment")
    for name in "${!after[@]}"; do
        if [[ "${after[$name]}" != "${before[$name]-}" && "${!name-}" == "${before[$name]-}" ]]; then
            export "${name}=${after[$name]}"
            given+=("${name}=${after[$name]}")
        fi
    done
    [[ ${#given[@]} -gt 0 ]] || given=("nothing: every value it sets was exported after the config")
    echo "${LAUNCHER}: sourced $(shown "$fragment"): ${given[*]}"
}

# The environment (NUL-separated) of a clean shell after sourcing the files $@ in order.
sourced_env() {
    # shellcheck disable=SC2016  # expanded by the inner bash
    env -i bash -c 'for file; do source "$file" || exit; done; env -0' _ "$@"
}

# Trial $1's seed: SEED+$1-1, or a random one unlike the earlier trials' (" $2 "): the seed checker refuses two
# runs with the same seed.
pick_seed() {
    local seed
    if [[ -n "${SEED:-}" ]]; then
        echo $((10#$SEED + $1 - 1))  # check_names: digits only
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

# Trial $1 with seed $2, its output in its log; the status is run_and_time.sh's (75: stopped, resumable), or 74 when
# its log could not be written in full (a full LOGDIR: the trial runs on, its output still reaching the terminal, and
# one line says which file and why once it has ended). A resumed trial's output is appended to its log, on a line of
# its own if the stopped one was cut mid-line. The log is there already (run_trials creates it): tee appends.
# A SIGTERM or SIGINT to the trial's group (run_in_group) is for run_trial's command alone, which passes it on to the
# training (run_and_time.sh, docker run): the shells here wait for it and keep its status (75 when it stopped at a
# checkpoint), and tee writes the log to the trial's last line, to the terminal too while it can: a reader of the
# launcher's output that goes first (a terminal's `| tee`, which Ctrl-C ends at once) is no longer written to (tee -p),
# where tee died of SIGPIPE, and with it the log's last lines, the output filters and the resumable stop.
one_trial() {
    local log=${logs[-1]} begin="Beginning" tee_errors statuses
    trap : TERM INT
    if (( $1 == resume_trial )); then
        begin="Resuming"
        [[ ! -s "$log" || -z "$(tail -c 1 -- "$log")" ]] || echo >>"$log"
    fi
    tee_errors=$(mktemp)
    trap 'rm -f -- "$tee_errors"' EXIT
    {
        (
            # A stop before run_trial ends the trial here; then run_trial's command acts on it (a subshell's and a
            # command's caught signals are reset) and this shell waits for its status.
            trap 'exit 143' TERM
            trap 'exit 130' INT
            echo "${begin} trial ${1} of ${NEXP}"
            [[ -z "${RUNS_IMAGE:-}" ]] || echo "Image: ${RUNS_IMAGE}"
            if clear_caches; then export CACHE_CLEARED=1; else export CACHE_CLEARED=0; fi
            export SEED="$2"
            trap : TERM INT
            run_trial
        ) |& (trap '' TERM INT; exec tee -p -a -- "$log" 2>"$tee_errors")  # ignored: tee ends when its input does
        statuses=("${PIPESTATUS[@]}")
    } || true
    if (( statuses[1] != 0 )); then
        say_error "trial ${1} of ${NEXP}: its log is incomplete ($(head -n 1 -- "$tee_errors"))"
        return 74
    fi
    return "${statuses[0]}"
}

# The launcher's stop (run_in_group): SIGTERM or SIGINT ($2) reached it while stage ran, whose command ended with
# status $1; it exits $3 (128 + the signal) with no further trial: a stopped launcher leaves nothing running. scancel
# and Slurm's time limit end run.sub this way too (SIGTERM to the batch script and to every task). A trial that stopped
# at a checkpoint (status 75 with its resumable_stop line: RN50_CHECKPOINT_DIR) is a resumable stop, as without the
# signal (run_trials), but not requeued (on_resumable_stop): the signal was a stop.
# shellcheck disable=SC2154  # i, seed, stage: the trial loop's
stop_group() {
    if [[ "$stage" == trial ]] && [[ "$(trial_outcome "$i" "$1" "${logs[-1]}" "$log_offset")" == resumable ]]; then
        stopped_resumable "$i" "$seed"
        say_error "stopped by SIG$2 in trial ${i} of ${NEXP}: stopped, resumable; no further trial runs"
        exit "$RESUMABLE_EXIT"
    fi
    case "$stage" in
        trial) say_error "stopped by SIG$2 in trial ${i} of ${NEXP} (no run_stop); no further trial runs" ;;
        summary) say_error "stopped by SIG$2 during the timing summary" ;;
        *) say_error "stopped by SIG$2 before the first trial; no further trial runs" ;;
    esac
    exit "$3"
}

# The settings check (python -m rn50_mx.check, with $@ before the data flags): one line naming a bad setting or a
# missing data file, before any trial runs.
check_settings() {
    run_in_group run_tool python -m rn50_mx.check "$@" --data-train "${DATA_SEEN_AS}/train.rec" \
        --data-val "${DATA_SEEN_AS}/val.rec" >/dev/null
}

# A stalled trial ($1, seed $2) is resumed as a resumable stop where the launcher requeues one (run.sub's
# on_resumable_stop) and its checkpoint folder holds a checkpoint to resume: the last checkpoint stays the resume
# point (python -m rn50_mx.check --resume says whether there is one). Fails, leaving no state, otherwise.
resumable_after_stall() {
    declare -F on_resumable_stop >/dev/null && [[ -n "${RN50_CHECKPOINT_DIR:-}" ]] || return 1
    stopped_resumable "$1" "$2"
    [[ -f "$RESUME_STATE" ]] || return 1
    check_settings --resume "${LOGS_SEEN_AS}/${RESUME_STATE##*/}" 2>/dev/null && return 0
    rm -f -- "$RESUME_STATE"
    return 1
}

# Trial $1 stopped resumable: the state is kept, the launcher requeued (on_resumable_stop) and the loop exits 75.
resumable_stop() {
    stopped_resumable "$1" "$2"
    say_error "trial ${1} of ${NEXP}: ${3:-stopped, resumable}; no further trial runs"
    if declare -F on_resumable_stop >/dev/null; then on_resumable_stop; fi
    exit "$RESUMABLE_EXIT"
}

run_trials() {
    local i seed logs=() seen_logs=() diverged=() stalled=() stage=check log_offset
    # Fail before any trial on a bad setting or a missing data file: one line naming it.
    # A stopped trial to resume: its checkpoint must be there (else it would start afresh and the state be lost).
    local resuming=()
    if (( resume_trial > 0 )); then resuming=(--resume "${LOGS_SEEN_AS}/${RESUME_STATE##*/}"); fi
    check_settings "${resuming[@]}"
    # SELFTEST=1: the self-test of the stack, the config and the data first (README "GPU users"); a failed check
    # stops the launch before any trial.
    if [[ "${SELFTEST:-0}" == 1 ]]; then
        run_in_group run_tool python -m rn50_mx.selftest --data-train "${DATA_SEEN_AS}/train.rec" \
            --data-val "${DATA_SEEN_AS}/val.rec" || die "the self-test failed (its table says which check): no trial ran"
    fi
    stage=trial
    for ((i = 1; i <= NEXP; i++)); do
        logs+=("${LOGDIR}/${DATESTAMP}_${i}.log")
        seen_logs+=("${LOGS_SEEN_AS}/${DATESTAMP}_${i}.log")
        if (( i < resume_trial )); then continue; fi  # done by the launch that stopped
        refuse_special "${logs[-1]}"
        if (( i == resume_trial )); then
            seed=$resume_seed
            [[ -e "${logs[-1]}" ]] || create_log "${logs[-1]}"
        else
            seed=$(pick_seed "$i" "$used_seeds")
            create_log "${logs[-1]}"
        fi
        [[ "$used_seeds" == *" $seed "* ]] || used_seeds+="$seed "
        trial_status=0
        log_offset=$(stat -c %s -- "${logs[-1]}")
        run_in_group one_trial "$i" "$seed" || trial_status=$?
        if (( trial_status == 74 )); then
            say_error "no further trial runs: its log would be lost too"
            exit 1
        fi
        case "$(trial_outcome "$i" "$trial_status" "${logs[-1]}" "$log_offset")" in
            success) ;;
            resumable) resumable_stop "$i" "$seed" ;;
            diverged) failed+=("$i") diverged+=("$i") ;;
            stalled)
                if resumable_after_stall "$i" "$seed"; then
                    resumable_stop "$i" "$seed" "stalled; its checkpoint folder holds a checkpoint to resume"
                fi
                failed+=("$i") stalled+=("$i") ;;
            *) failed+=("$i") ;;
        esac
        rm -f -- "$RESUME_STATE"  # kept until the resumed trial has ended: a launch stopped before it resumes it again
    done
    stage=summary
    echo "Logs: ${logs[*]}"
    [[ -z "${RUNS_IMAGE:-}" ]] || echo "Image: ${RUNS_IMAGE}"
    run_in_group run_tool python -m rn50_mx.timing "${seen_logs[@]}" || say_error "no timing summary"
    if (( ${#failed[@]} > 0 )); then
        local why=""
        if (( ${#diverged[@]} > 0 )); then
            why+="; ${diverged[*]} diverged (each log says at which step and loss): the settings that set the step size"
            why+=" do not train"
        fi
        if (( ${#stalled[@]} > 0 )); then
            why+="; ${stalled[*]} stalled (each log says which rank made no progress, and since when)"
        fi
        say_error "trial(s) ${failed[*]} of ${NEXP} failed${why}"
        exit 1
    fi
}

# shellcheck shell=bash
# What the launchers share, one place for each concern: run_with_docker.sh and run.sub (through trials.sh, their trial
# loop), run_and_time.sh (in the image too: the Dockerfile copies rn50_mx/) and `make image-cpu` source it. Bash,
# coreutils, util-linux's setsid, procps' ps and flock only: a container launch's host needs nothing but these and
# docker.
#   names     check_names: every variable that names a path, an image or a stamp, or a count, checked before use;
#             `named VAR` shows one in a message, escaped, on one line
#   tying     tie_launch, tie_to: nothing a launch started (processes, containers) outlives its launcher, however the
#             launcher ends (SIGKILL included); run_in_group: a long command stopped with the launcher's signal
#   locks     hold_lock: one flock, a second holder refused in one line
#   outcomes  run_outcome, trial_outcome: what an exit status means, read with its run's MLPerf lines
# The sourcing script sets LAUNCHER (its name, for messages).

# shellcheck source=rn50_mx/exit_codes.sh
source "$(dirname "${BASH_SOURCE[0]}")/exit_codes.sh"
LAUNCH_LIB=$(readlink -f -- "${BASH_SOURCE[0]}")

say_error() { echo "${LAUNCHER}: $*" >&2 || true; }  # a reader that has gone (stopped_group) ends no launcher here
die() { say_error "$@"; exit 2; }

# --- names ----------------------------------------------------------------------------------------------------------

# The variables a launcher takes as names or numbers, each with its kind: every one is checked by check_names, and
# tests/test_launch_hostile.py runs each through the standard hostile values (a variable added here joins that table).
LAUNCH_INPUTS=(DATADIR:folder LOGDIR:folder RN50_CHECKPOINT_DIR:folder DATESTAMP:stamp DGXSYSTEM:stamp CONT:image
               NEXP:count STOP_GRACE:seconds SEED:seed)

# $1 as a shell reads it back, on one line: printf %q (a line break shows as $'a\nb', a glob character escaped).
shown() { printf '%q' "$1"; }

# NAME=value of variable $1 for a message, its value shown.
named() { printf '%s=%s' "$1" "$(shown "${!1-}")"; }

# A plain image reference, as `docker run` takes one: [host[:port]/]path[:tag][@sha256:digest], each path component
# lower-case letters and digits joined by '.', '_' or '-' (what docker's reference grammar allows, less its rarer
# forms), or an image ID: never an option, never two words.
IMAGE_NAME='^([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]+)?/)?'
IMAGE_NAME+='[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*'
IMAGE_NAME+='(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$|^sha256:[0-9a-f]{64}$'

# Dies, in one line naming the variable, on the first of LAUNCH_INPUTS that is set to what its kind does not take:
# no control character in any (a line break would split every message and log line that shows it); a folder that is
# not there or not a folder when it must be (DATADIR) is the launcher's own check. Unset or empty means the default.
check_names() {
    local input name kind value
    for input in "${LAUNCH_INPUTS[@]}"; do
        name=${input%%:*} kind=${input#*:} value=${!name-}
        [[ -n "$value" ]] || continue
        [[ "$value" != *[[:cntrl:]]* ]] || die "$(named "$name"): a control character (a line break, a tab) in it:" \
            "give a name without one"
        case "$kind" in
            stamp) [[ "$value" =~ ^[A-Za-z0-9._-]{1,200}$ ]] || die "$(named "$name"): expected letters, digits," \
                "'.', '_' or '-' (at most 200)" ;;
            count) [[ "$value" =~ ^[1-9][0-9]{0,2}$ ]] || die "$(named "$name"): expected a whole number, 1 to 999" ;;
            seconds) [[ "$value" =~ ^[1-9][0-9]{0,5}$ ]] || die "$(named "$name"): expected whole seconds, 1 to" \
                "999999" ;;
            seed) [[ "$value" =~ ^[0-9]{1,9}$ ]] || die "$(named "$name"): expected a whole number, 0 to 999999999" ;;
            image) [[ "$value" =~ $IMAGE_NAME ]] || die "$(named "$name"): not an image name (such as rn50-mx or" \
                "registry:5000/team/rn50-mx:cpu): give the image's name or ID" ;;
        esac
    done
}

# The absolute path of folder variable $1 (missing components allowed: LOGDIR is created later), the name read as a
# name (`--`).
absolute() { realpath -m -- "${!1}" 2>/dev/null || die "$(named "$1"): cannot resolve the path"; }

# --- tying ----------------------------------------------------------------------------------------------------------

# START_TIME: the start time of process $1 (clock ticks after boot, /proc/PID/stat field 22), with the pid what names
# a process and no later one given the same pid; empty when it has ended, a zombie (ended, not yet reaped) included.
# A variable, not output: the watcher reads it every 0.05 s without starting a process.
read_start() {
    local stat
    START_TIME=""
    { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 0
    stat=${stat##*) }  # after the command name, which may hold spaces
    read -r -a stat <<<"$stat"
    [[ "${stat[0]}" == Z ]] || START_TIME=${stat[19]}
}

# Ties every process started from here on, and (with $2 = containers) every container labelled
# rn50-mx.launch=LAUNCH_ID, to the life of process $1 (this shell, or make for its recipe): they carry the id in
# RN50MX_LAUNCH (after the ids of the launches this one runs under), and a watcher in a session of its own, which no
# signal to this launch's process groups reaches, ends them once process $1 has ended, however it ended (SIGKILL, the
# OOM killer, a CI runner ending its job's first process). A killed `docker run` client leaves its container running:
# the watcher removes it.
tie_to() {
    read_start "$1"
    LAUNCH_ID="rn50-mx-$1-${START_TIME}" LAUNCH_CONTAINERS=${2:-}
    # shellcheck disable=SC2034  # the label run_with_docker.sh gives each container
    LAUNCH_LABEL="rn50-mx.launch=${LAUNCH_ID}"
    if [[ " ${RN50MX_LAUNCH:-} " == *" ${LAUNCH_ID} "* ]]; then return; fi  # tied already (tie_launch's second run)
    # stdin and stdout closed, stderr kept for its one line: a reader of this launch's output sees its end soon after
    # the launcher's (the watcher polls every 0.05 s). Its command line names nothing of the launch (its values come
    # in its environment), so that `pkill -f run_with_docker.sh` ends the launcher and not its watcher too; and it
    # carries no launch's id (an outer launch's watcher would end it with the outer launch).
    # shellcheck disable=SC2016  # expanded by the watcher's bash
    WATCH_LIB=$LAUNCH_LIB WATCH_PID=$1 WATCH_ID=$LAUNCH_ID WATCH_LAUNCHER=$LAUNCHER WATCH_CONTAINERS=$LAUNCH_CONTAINERS \
        env -u RN50MX_LAUNCH setsid "$BASH" -c \
        'source "$WATCH_LIB"; watch_launch "$WATCH_PID" "$WATCH_ID" "$WATCH_LAUNCHER" "$WATCH_CONTAINERS"' \
        </dev/null >/dev/null &
    export RN50MX_LAUNCH="${RN50MX_LAUNCH:+${RN50MX_LAUNCH} }${LAUNCH_ID}"
}

# tie_to this shell ($1: containers or nothing), then this script run again in place (exec: the same pid) with the id
# in its environment, so that its own subshells carry it too: call it first, with the script's arguments after $1.
tie_launch() {
    tie_to "$$" "$1"
    shift
    [[ "$(tr '\0' '\n' </proc/$$/environ)" == *"${LAUNCH_ID}"* ]] || exec "$BASH" "$0" "$@"
}

# The watcher of tie_to: waits for process $1 to end, then ends launch $2's processes and containers (with $4 =
# containers) and says so in one line when it found any.
watch_launch() {
    local start
    trap '' PIPE HUP INT TERM QUIT  # a signal to everything named alike, or to the terminal's group, is not for it
    start=${2##*-}
    while read_start "$1" && [[ "$START_TIME" == "$start" ]]; do nap 0.05; done
    LAUNCHER=$3
    local ended settle=0
    # What a launcher that ended well started is ending too (a pipeline's last process): given 0.5 s to do so.
    while [[ -n "$(launch_pids "$2")" ]] && (( settle++ < 10 )); do nap 0.05; done
    ended=$(end_launch "$2" "${4:-}" 3)
    [[ "$ended" == "0 0" ]] || say_error "process $1 ended, ${ended% *} process(es) and ${ended#* } container(s) of" \
        "its launch still running: ended them"
}

# The pids of launch $1's processes: those whose environment holds the id in RN50MX_LAUNCH, and the members of the
# process groups such a process leads (a command run with a cleared environment, as mmdebstrap's hooks are, stays in
# its parent's group). Never the caller's own: the shells it runs in (its ancestors: a launcher ending its own launch,
# stopped_group) and its helpers (ps, grep, awk), which carry the id then too, so that the ending finds an end.
launch_pids() {
    local id=$1
    (
        self=$BASHPID  # this subshell: ps, grep and awk are its children
        ps -e -o pid=,ppid=,pgid=,stat= | awk -v self="$self" -v marked="$(
            grep -lzE "^RN50MX_LAUNCH=(.* )?${id}( .*)?$" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)" '
            BEGIN { split(marked, m); for (i in m) tied[m[i]] = 1 }
            { parent[$1] = $2; group[$1] = $3; state[$1] = $4 }
            END {
                for (up = self; up in parent && n++ < 1000; up = parent[up]) own[up] = 1
                for (pid in parent) {
                    if (!(pid in tied || group[pid] in tied) || pid in own || state[pid] ~ /^Z/) continue
                    k = 0
                    for (up = pid; up in parent && up != self && k++ < 1000; up = parent[up]) {}
                    if (up != self) print pid
                }
            }'
    )
}

# Ends launch $1's processes (but the caller's own, launch_pids) and, with $2 = containers, its containers (docker rm -f by its
# label): SIGTERM, then SIGKILL to what still runs $3 seconds later (0: SIGKILL at once); returns once none is left,
# printing how many processes and containers there were.
end_launch() {
    local id=$1 containers=$2 grace=$3 signal=TERM rounds=0 found=0 removed=0 pids
    (( grace > 0 )) || signal=KILL
    while mapfile -t pids < <(launch_pids "$id") && (( ${#pids[@]} > 0 && rounds < 100 )); do
        (( rounds > 0 )) || found=${#pids[@]}
        kill -"$signal" "${pids[@]}" 2>/dev/null || true
        if (( rounds == 0 )) && [[ "$containers" == containers ]]; then removed=$(remove_containers "$id"); fi
        rounds=$((rounds + 1))
        (( rounds < grace * 5 )) || signal=KILL
        nap 0.2
    done
    # A `docker run` client killed as it created its container leaves one that the first removal missed.
    if [[ "$containers" == containers ]]; then
        rounds=$(remove_containers "$id")
        (( removed > 0 )) || removed=$rounds
    fi
    echo "$found $removed"
}

# Removes launch $1's containers, running or not; prints how many there were.
remove_containers() {
    local ids
    mapfile -t ids < <(docker ps -aq --filter "label=rn50-mx.launch=$1" 2>/dev/null)
    (( ${#ids[@]} == 0 )) || docker rm -f "${ids[@]}" >/dev/null 2>&1 || true
    echo "${#ids[@]}"
}

# Runs "$@" in a process group of its own and waits for it: every command a launcher starts that may take long. A
# SIGTERM or SIGINT reaching the launcher is passed to that whole group and stop_group (the launcher's, else
# stop_group_here) acts on it; a signal that comes as the command starts (bash runs a trap between commands) is acted
# on once its group is known.
run_in_group() {
    local group="" asked="" status=0
    trap 'asked="TERM 143"; [[ -z "$group" ]] || stopped_group "$group" $asked' TERM
    trap 'asked="INT 130"; [[ -z "$group" ]] || stopped_group "$group" $asked' INT
    set -m
    "$@" &
    group=$!
    set +m
    # shellcheck disable=SC2086  # the signal's name and exit status
    [[ -z "$asked" ]] || stopped_group "$group" $asked
    wait "$group" || status=$?
    trap - TERM INT
    return "$status"
}

# Group $1 was asked to stop by SIG$2: passes it on, and waits until nothing of the group runs, ending what still runs
# of the launch STOP_GRACE seconds later (default 10; a rank stuck in a collective never runs its signal handler),
# whatever its group, containers included: a stop never hangs. Then calls stop_group (the launcher's own, with the
# leader's status, the signal and the exit status 128 + the signal), else exits 128 + the signal. The grace is counted
# here, between naps, not by a timer in the background: a timer's `sleep` outlived the launcher when the timer was
# ended before it had become `sleep` (the watcher then ended it, and said so after the launcher's last line).
stopped_group() {
    local status=137
    # A second signal (a trap run mid-nap: this function again) keeps the first one's deadline. A reader of the
    # launcher's output that has gone (Ctrl-C ends a terminal's `|& tee` too) ends no stop: its lines are dropped.
    STOP_DEADLINE=${STOP_DEADLINE:-$((SECONDS + ${STOP_GRACE:-10} + 1))}
    trap '' PIPE
    kill -"$2" -- "-$1" 2>/dev/null
    while kill -0 -- "-$1" 2>/dev/null; do
        if (( SECONDS >= STOP_DEADLINE )); then
            say_error "stopped by SIG$2: what it started still ran ${STOP_GRACE:-10} s later; killed"
            end_launch "$LAUNCH_ID" "$LAUNCH_CONTAINERS" 0 >/dev/null
            break
        fi
        nap 0.2
    done
    # The leader's status, which bash keeps once it has reaped it; quiet: bash's own line for a killed job is not
    # shown (the line above says it).
    if ! kill -0 "$1" 2>/dev/null; then
        status=0
        wait "$1" 2>/dev/null || status=$?
    fi
    trap '' TERM INT  # the stop is decided: a later signal would run stop_group a second time (its state half written)
    if declare -F stop_group >/dev/null; then stop_group "$status" "$2" "$3"; fi
    say_error "stopped by SIG$2"
    exit "$3"
}

# Sleeps $1 seconds without starting a process: `read -t` on a pipe no one writes (opened on the first nap, which sets
# $!; a subshell shares it). A shell ended mid-nap leaves no child behind, where a `sleep` (or whatever PATH calls
# sleep) could outlive it.
unset NAP_FD STOP_DEADLINE  # this file's, never the environment's
nap() {
    [[ -n "${NAP_FD:-}" ]] || exec {NAP_FD}<> <(:)
    read -r -t "$1" -u "$NAP_FD" || true
}

# --- locks ----------------------------------------------------------------------------------------------------------

# Holds an exclusive flock on file $1 (created when missing) until this shell ends, on descriptor LOCK_FD; with $2 =
# wait, waits for another holder, saying so once. Returns 1 when another process holds it, 2 when the file cannot be
# opened (a read-only or missing folder). The kernel drops it when its holders end: a killed launch leaves no stale
# lock. A holder may remove the file as it ends (trials.sh does): a lock taken on the file it removed, opened just
# before, is no lock on the name, so the file locked must still be the one at $1, or the lock is taken again there
# (rn50_mx/files.py try_lock keeps the Python tools' locks the same way).
hold_lock() {
    local said=
    while true; do
        { exec {LOCK_FD}>>"$1"; } 2>/dev/null || return 2
        if ! flock -n "$LOCK_FD"; then
            [[ "${2:-}" == wait ]] || return 1
            [[ -n "$said" ]] || say_error "waiting for another process, which holds $(shown "$1")"
            said=1
            flock "$LOCK_FD"
        fi
        [[ "/proc/self/fd/${LOCK_FD}" -ef "$1" ]] && return 0
        exec {LOCK_FD}>&-
    done
}

# --- outcomes -------------------------------------------------------------------------------------------------------

# The MLPerf lines of file $1 from byte $2 (default 0) on: a resumed trial's log holds the stopped run's lines first.
mllog_lines() { tail -c +"$(( ${2:-0} + 1 ))" -- "$1" | grep -aE '^:::MLLOG ' || true; }

# The value of MLPerf event $2 in MLPerf lines $1 (the first such line), or nothing; for run_stop, its status.
mllog_value() {
    local pattern='"value": ([^,]*)'
    [[ "$2" == run_stop ]] && pattern='"status": "([a-z_]*)"'
    { grep -E "\"key\": \"$2\"" <<<"$1" || true; } | head -n 1 | sed -nE "s/.*${pattern}.*/\1/p"
}

# A run's outcome from its exit status $1 and its MLPerf lines $2, the one reading of both (run_and_time.sh reads its
# training's, the trial loop each trial's):
#   success    run_stop success, whatever the status (a process that hung on its way out was ended by its exit alarm)
#   resumable  resumable_stop: stopped after writing a checkpoint
#   diverged   diverged, with no run_stop success (a stray line is not the verdict)
#   stalled    stalled (the progress watchdog's), with no run_stop success
#   missed     run_stop aborted and status 0: the target was not reached
#   failed     anything else
run_outcome() {
    local stopped
    stopped=$(mllog_value "$2" run_stop)
    if [[ -n "$(mllog_value "$2" resumable_stop)" ]]; then echo resumable
    elif [[ "$stopped" == success ]]; then echo success
    elif [[ -n "$(mllog_value "$2" diverged)" ]]; then echo diverged
    elif [[ -n "$(mllog_value "$2" stalled)" ]]; then echo stalled
    elif [[ "$stopped" == aborted && "$1" == 0 ]]; then echo missed
    else echo failed
    fi
}

# The exit status that claims outcome $1 (run_and_time.sh exits with it), or nothing for a failure.
outcome_status() {
    case "$1" in
        success) echo 0 ;;
        resumable) echo "$RESUMABLE_EXIT" ;;
        diverged) echo "$DIVERGED_EXIT" ;;
        stalled) echo "$STALLED_EXIT" ;;
        missed) echo "$MISSED_EXIT" ;;
    esac
}

# Whether exit status $1 claims an outcome that its MLPerf line must show: 0, 75, 78, 79.
claims_outcome() {
    local outcome
    for outcome in success resumable diverged stalled; do
        [[ "$1" != "$(outcome_status "$outcome")" ]] || return 0
    done
    return 1
}

# The MLPerf line that shows outcome $1.
outcome_line() {
    case "$1" in
        success) echo "run_stop success" ;;
        resumable) echo resumable_stop ;;
        *) echo "$1" ;;
    esac
}

# Trial $1's outcome from its exit status $2 and its log $3 from byte $4 on: success, resumable, diverged, stalled or
# failed. A status that claims an outcome (0, 75, 78, 79) is that outcome only with its MLPerf line in the log, else a
# failed trial, and one line says so (a training that exits 75 without writing a checkpoint is not resumed, nor is a
# container that printed a usage text and exited 0 a success).
trial_outcome() {
    local status=$2 outcome claimed
    outcome=$(run_outcome "$status" "$(mllog_lines "$3" "$4")")
    for claimed in success resumable diverged stalled; do
        if [[ "$status" == "$(outcome_status "$claimed")" ]]; then
            if [[ "$outcome" == "$claimed" ]]; then echo "$claimed"; return; fi
            say_error "trial $1 of ${NEXP}: exit status ${status}, but its log ($(shown "$3")) has no" \
                "$(outcome_line "$claimed") line: a failed trial"
        fi
    done
    echo failed
}

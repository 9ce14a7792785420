#!/usr/bin/env bash
# NEXP timed runs on one node (MLPerf scores 5), each after a page-cache drop, each logged to
# LOGDIR/<DATESTAMP>_<i>.log, then the timing summary of those logs (run_with_docker.sh):
#   source config/NF5688M6.sh
#   CONT=<image built from ./Dockerfile> DATADIR=/raid/imagenet-rec LOGDIR=$PWD/results ./run_with_docker.sh
# With CONT set, each trial runs run_and_time.sh in a fresh container with all GPUs, the host's IPC and network,
# DATADIR mounted at /data and LOGDIR at /results; CONT is resolved once, before any trial, to its image ID, which
# every container of the launch runs and never pulls. Without CONT it runs on this machine, DATADIR as it is, with
# `python` and `horovodrun` from PATH: the CPU path of `make demo` and CI. However the launcher ends (SIGKILL too),
# nothing of its launch runs 10 s later, processes or containers (rn50_mx/launch.sh: names, tying, outcomes).
#
# DGXSYSTEM  set by the config; config/<DGXSYSTEM>_tuned.sh (python -m rn50_mx.tune), then _hparams.sh (python -m
#            rn50_mx.search), are sourced after it when there (trials.sh's source_fragments: an export after the
#            config still wins). The container gets,
#            with the values they have here (so an export after sourcing the config is an override), the
#            variables config/<DGXSYSTEM>.sh exports and any other set here that rn50_mx reads (`python -m
#            rn50_mx.check --env-names` in the image: its names, DALI_*, RN50_*).
# DATADIR    folder with train.rec/.idx and val.rec/.idx (required; `python -m rn50_mx.check` checks
#            them before the first trial)
# LOGDIR     where the logs go (default ./results);  NEXP  number of trials (default 5)
# SEED       trial i uses SEED+i-1; unset, each trial draws a different random seed. The seed checker refuses
#            two runs with the same seed, so trials never repeat one.
# CLEAR_CACHES  1 (default): drop the page cache before each trial; 0: don't. Training logs cache_clear as
#            true only when the drop really happened.
# SELFTEST   1: run `python -m rn50_mx.selftest` on the config and the data before the first trial (a failed
#            check stops the launch); 0 (default): don't.
# STOP_GRACE seconds a trial stopped by SIGTERM or Ctrl-C has to end (its checkpoint written) before what still runs
#            of it is killed (default 120)
# FRAGMENTS  1 (default): source the config's fragments (DGXSYSTEM above); 0: don't (the search's trials, which
#            export every value).
set -euo pipefail

HERE=$(dirname "$(readlink -f -- "${BASH_SOURCE[0]}")")
LAUNCHER=run_with_docker.sh
# shellcheck source=trials.sh
source "${HERE}/trials.sh"
tie_launch "${CONT:+containers}" "$@"  # nothing of this launch outlives it (rn50_mx/launch.sh)
check_names

[[ -n "${DGXSYSTEM:-}" ]] || die "DGXSYSTEM is not set: source a config/<SYSTEM>.sh first"
CONFIG="${HERE}/config/${DGXSYSTEM}.sh"
[[ -f "$CONFIG" ]] || die "$(named DGXSYSTEM): no $(shown "$CONFIG")"
source_fragments "$CONFIG"
launch_settings "$PWD/results"

# The names config/<DGXSYSTEM>.sh exports, as the reference computes them.
config_names() {
    # shellcheck disable=SC2016  # $1 is expanded by the inner bash
    env -i bash -c 'source "$1" && compgen -e' _ "$CONFIG" | grep -vxE 'PWD|SHLVL|_|OLDPWD'
}

# The variables set here whose name is one of $@: names, or patterns such as DALI_* (the prefixes rn50_mx owns).
names_set_here() {
    local name pattern
    while read -r name; do
        for pattern in "$@"; do
            # shellcheck disable=SC2053  # unquoted, $pattern matches as a glob
            if [[ $name == $pattern ]]; then
                echo "$name"
                break
            fi
        done
    done < <(compgen -e)
}

# Before any trial, one line for a folder docker cannot mount, an engine that does not answer, an image it does not
# have, a DATADIR the launching user cannot read (the containers run as that user, with the same groups; the check in
# the container would name only /data). CONT is resolved here, once, to the image's ID (IMAGE_ID), which every
# container of the launch runs: a `docker tag` or `docker rmi` of CONT meanwhile changes nothing, and nothing is pulled.
check_container() {
    local name
    for name in DATADIR LOGDIR; do  # docker run -v SOURCE:TARGET splits at every ':'
        [[ "${!name}" != *:* ]] || die "$(named "$name"): a ':' in the path, which docker run -v cannot mount:" \
            "rename the folder or give another"
    done
    docker version >/dev/null 2>&1 || die "$(named CONT): the Docker engine does not answer" \
        "(DOCKER_HOST=$(shown "${DOCKER_HOST:-unset}")): start it, or unset CONT to run on this machine"
    IMAGE_ID=$(docker image inspect --format '{{.Id}}' -- "$CONT" 2>/dev/null) || true
    [[ "$IMAGE_ID" =~ ^sha256:[0-9a-f]{64}$ ]] || die "$(named CONT): the engine has no such image: build it" \
        "(docker build -t $(shown "$CONT") . ; the CPU image: make image-cpu)"
    [[ -r "$DATADIR" && -x "$DATADIR" ]] || die "$(named DATADIR): not readable by the launching user, who the" \
        "containers run as"
}

# The names to hand on to the containers, asked of the image (the host may not have rn50_mx): also the check that the
# image runs rn50_mx at all, one line naming CONT when it does not.
image_env_names() {
    local names errors
    errors=$(mktemp)
    if ! names=$("${DOCKER_RUN[@]}" "$IMAGE_ID" python -m rn50_mx.check --env-names 2>"$errors"); then
        die "$(named CONT) (image ${IMAGE_ID}): cannot run python -m rn50_mx.check ($(tail -n 1 -- "$errors"));" \
            "build it from this repository's Dockerfile"
    fi
    rm -f -- "$errors"
    echo "$names"
}

if [[ -n "${CONT:-}" ]]; then
    check_container
fi
own_logs

if [[ -n "${CONT:-}" ]]; then
    # The containers run as the launching user, so that what they write (checkpoints, plots, configs) is that user's,
    # with that user's supplementary groups (a DATADIR readable through a group; `--user` alone gives the primary
    # one) and a HOME that user can write (horovodrun keeps a cache there; the image's passwd may not know the user).
    # Each runs IMAGE_ID, never pulled, and carries the label LAUNCH_LABEL, by which tie_launch's watcher and a
    # stopped trial's timeout find it (a killed `docker run` client leaves its container running).
    # A CPU config gets no GPU, nor the unlimited locked memory that the GPU's pinned buffers need (an engine without
    # CAP_SYS_RESOURCE cannot grant it).
    DOCKER_RUN=(docker run --rm --init --pull never --label "$LAUNCH_LABEL" --user "$(id -u):$(id -g)" --env HOME=/tmp)
    for gid in $(id -G); do
        [[ "$gid" == "$(id -g)" ]] || DOCKER_RUN+=(--group-add "$gid")
    done
    gpu_flags=(--gpus all)
    gpu_limits=(--ulimit memlock=-1)
    if [[ "${DEVICE:-cpu}" != gpu ]]; then
        echo "${LAUNCHER}: $(named DEVICE): the containers get no GPU (no --gpus all, no --ulimit memlock=-1)"
        gpu_flags=() gpu_limits=()
    fi
    DOCKER_RUN+=(
        "${gpu_flags[@]}" --net=host --uts=host --ipc=host --security-opt seccomp=unconfined
        --ulimit stack=67108864 "${gpu_limits[@]}" -v "${DATADIR}:/data" -v "${LOGDIR}:/results"
    )
    # The variables handed on (see DGXSYSTEM above) and the launcher's own. What rn50_mx reads is asked of the
    # image: the host may not have the package.
    env_names=$(image_env_names)
    mapfile -t env_names <<<"$env_names"
    mapfile -t forwarded < <({ config_names; names_set_here "${env_names[@]}"; } | sort -u)
    for name in "${forwarded[@]}" SEED CACHE_CLEARED; do
        DOCKER_RUN+=(--env "$name")
    done
    DOCKER_RUN+=(--env DATADIR=/data)
    RUNS_IMAGE="${IMAGE_ID} ($(named CONT))"
    echo "${LAUNCHER}: every container of this launch runs image ${RUNS_IMAGE}"
    DATA_SEEN_AS=/data
    LOGS_SEEN_AS=/results
    RUN_AND_TIME=./run_and_time.sh
else
    DATA_SEEN_AS=$DATADIR
    LOGS_SEEN_AS=$LOGDIR
    RUN_AND_TIME=${HERE}/run_and_time.sh
fi

# Runs a command on this machine, or in the container when CONT is set.
run_tool() {
    if [[ -n "${CONT:-}" ]]; then
        "${DOCKER_RUN[@]}" "$IMAGE_ID" "$@"
    else
        "$@"
    fi
}

run_trial() { run_tool "$RUN_AND_TIME"; }

# Drops the page cache so that each trial reads the data from disk (MLPerf rules); fails when not permitted.
drop_caches() {
    sync
    if { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null || sudo -n /sbin/sysctl -q vm.drop_caches=3 2>/dev/null; then
        echo "Cleared the page cache on $(hostname)"
        return 0
    fi
    echo "Could not clear the page cache on $(hostname) (needs root or passwordless sudo): cache_clear is logged false"
    return 1
}

run_trials

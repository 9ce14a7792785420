"""The CPU image and `./run_with_docker.sh` under a real Docker engine (tests/support/engine.py: a private dockerd,
the image built with `make image-cpu` once a run or loaded from the cache). The launcher runs as an unprivileged user
(nobody), so that who owns what the containers write is seen: trials in fresh containers with distinct seeds, the
settings exported by hand handed on, the data at /data, the timing summary read from /results in the image, all of
the launch in the one image CONT named at its start; SIGTERM to the launcher reaching the training inside, and the
next launch resuming its checkpoint in a new container; SIGKILL to the launcher leaving no container; a missing
image, a stopped engine and an unreadable DATADIR each one line before any trial; `make image-cpu` stopped while
mmdebstrap runs. Then the README's container commands, read from the README and run with the CPU image in place of
the GPU one."""
import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import time

import psutil
import pytest

from tests.support import engine as engine_support
from tests.support.mllog import mllog
from tests.support.procs import ROOT, assert_all_end, descendants, files_in
from tests.support.settings import TINY, TINY_KEEP_CACHES

NOBODY = 65534
DATA_GROUP = 100  # Debian's `users`: the launcher's supplementary group, through which alone it reads the data
IMAGE = engine_support.IMAGE


@pytest.fixture(scope="module")
def engine(docker_engine):
    """The session's private engine holding the CPU image (built with `make image-cpu` or loaded from the cache)."""
    if docker_engine.docker("image", "inspect", IMAGE).returncode != 0:
        how, seconds = engine_support.cpu_image(docker_engine)
        print(f"{IMAGE}: {how} in {seconds:.0f} s")
    return docker_engine


@pytest.fixture
def home():
    """A folder nobody owns (pytest's tmp_path is root's alone), with bin/docker: Debian's CLI, which make installs
    (PATH may have another first), and the launcher's files copied from the checkout (which nobody may not reach)."""
    folder = tempfile.mkdtemp(prefix="rn50-nobody-")
    os.chmod(folder, 0o755)
    try:
        os.mkdir(os.path.join(folder, "bin"))
        os.symlink(engine_support.DOCKER, os.path.join(folder, "bin", "docker"))
        os.mkdir(os.path.join(folder, "checkout"))
        os.mkdir(os.path.join(folder, "checkout", "rn50_mx"))
        for name in ("run_with_docker.sh", "trials.sh", "rn50_mx/launch.sh", "rn50_mx/exit_codes.sh"):  # it sources
            shutil.copy2(os.path.join(ROOT, name), os.path.join(folder, "checkout", name))
        shutil.copytree(os.path.join(ROOT, "config"), os.path.join(folder, "checkout", "config"))
        for parent, dirs, names in os.walk(folder):
            for name in [parent, *(os.path.join(parent, n) for n in dirs + names)]:
                os.chown(name, NOBODY, NOBODY, follow_symlinks=False)
        yield pathlib.Path(folder)
    finally:
        shutil.rmtree(folder)


def as_nobody(script, home, engine, env=None, **popen):
    """bash -c `script` as nobody from home/checkout, in a clean environment (plus `env`) naming the private engine;
    the Popen (stdout and stderr to home/out.txt unless given)."""
    full_env = {"PATH": f"{home}/bin:/usr/bin:/bin", "HOME": str(home), **engine.env, **(env or {})}
    if "stdout" not in popen:
        popen.update(stdout=open(home / "out.txt", "w"), stderr=subprocess.STDOUT)
    return subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", f"--groups={DATA_GROUP}", "bash",
                             "-c", script], env=full_env, cwd=home / "checkout", start_new_session=True, **popen)


def data(three_classes, home):
    """A copy of the three_classes set that nobody reads through its supplementary group only (root's, group
    DATA_GROUP, mode 0750: `docker run --user` alone gives the primary group)."""
    folder = home / "data"
    shutil.copytree(three_classes, folder)
    for path in [folder, *folder.iterdir()]:
        shutil.chown(path, 0, DATA_GROUP)
        os.chmod(path, 0o750 if path.is_dir() else 0o640)
    return str(folder)


def launch(env, home, engine, **popen):
    """run_with_docker.sh as nobody with CONT set, after `source config/CPU.sh` and `env` exported."""
    exports = "".join(f"export {name}={value!r}; " for name, value in {"CONT": IMAGE, **env}.items())
    return as_nobody(f"set -euo pipefail; source config/CPU.sh; {exports}exec ./run_with_docker.sh", home, engine,
                     **popen)


def finished(proc, home, timeout=900):
    """Waits for `proc`; its exit status and output."""
    try:
        status = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return status, (home / "out.txt").read_text()


def past_the_first_step(proc, log, home):
    """`proc` (a launch) once its trial's `log` shows the first training step; a launch that ends first fails."""
    deadline = time.time() + 600
    while not (log.exists() and "epoch 1 step 1/" in log.read_text()):
        assert proc.poll() is None and time.time() < deadline, (home / "out.txt").read_text()[-3000:]
        time.sleep(0.2)
    return proc


def logdir(home):
    folder = home / "logs"
    folder.mkdir()
    shutil.chown(folder, NOBODY, NOBODY)
    return folder


def owners(folder):
    """{path under folder: owner uid} of everything there."""
    found = {}
    for parent, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = os.path.join(parent, name)
            found[os.path.relpath(path, folder)] = os.lstat(path).st_uid
    return found


def containers_started(engine, since):
    """The image of each container the engine started since `since` (a Unix time)."""
    events = engine.docker("events", "--since", str(int(since)), "--until", str(int(time.time()) + 1),
                           "--filter", "type=container", "--filter", "event=start", "--format", "{{json .}}")
    return [json.loads(line)["from"] for line in events.stdout.splitlines()]


@pytest.mark.slow
def test_trials_run_in_fresh_containers_with_the_settings_and_the_data_mounted(engine, three_classes, home, tmp_path):
    """Two trials of config/CPU.sh shrunk to seconds: each in a container of its own with seed SEED+i-1 (the seed
    checker refuses repeats), END_LR (exported by hand, not in the config) reaching training, the data read at /data,
    cache_clear logged as the page-cache drop went (nobody may not drop it), the summary run in the image on /results;
    a CPU config gets no GPU and says so. (This replaces the bare launcher's two-trial test: the trial loop is the
    same, trials.sh; the bare trial runs in test_make_demos_config_trains_in_float32_on_a_cpu_without_bfloat16.)
    CONT is given to another image by `docker tag` while trial 1 runs: every container of the launch still runs the
    image CONT named when it began, by its ID, which both logs and the summary name. The old launcher looked CONT up
    at each `docker run`: trial 2 ran the other image."""
    image_id = engine.docker("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    assert engine.docker("tag", IMAGE, "rn50-mx:launched").returncode == 0
    engine_support.import_small_image(engine, "rn50-mx:other", str(tmp_path))
    logs = logdir(home)
    env = {**TINY, "NUM_CLASSES": "3", "DATADIR": data(three_classes, home), "LOGDIR": str(logs), "NEXP": "2",
           "SEED": "7", "DATESTAMP": "c", "END_LR": "0.0002", "DISP_BATCHES": "1", "CONT": "rn50-mx:launched"}
    since = time.time()
    proc = past_the_first_step(launch(env, home, engine), logs / "c_1.log", home)
    assert engine.docker("tag", "rn50-mx:other", "rn50-mx:launched").returncode == 0
    status, out = finished(proc, home)
    assert status == 0, out[-4000:]
    assert out.splitlines()[:2] == [
        "run_with_docker.sh: DEVICE=cpu: the containers get no GPU (no --gpus all, no --ulimit memlock=-1)",
        f"run_with_docker.sh: every container of this launch runs image {image_id} (CONT=rn50-mx:launched)"]
    # the env-names query, the settings check, two trials, the summary: all the image CONT named at the start
    assert containers_started(engine, since) == [image_id] * 5
    assert f"Image: {image_id} (CONT=rn50-mx:launched)" in out.split("Logs: ")[1]  # before the summary
    for i in (1, 2):
        path = logs / f"c_{i}.log"
        text = path.read_text()
        assert text.startswith(f"Beginning trial {i} of 2\nImage: {image_id} (CONT=rn50-mx:launched)\n")
        assert mllog(path, "seed") == [6 + i]
        assert mllog(path, "cache_clear") == ["Cleared the page cache" in text]
        assert mllog(path, "submission_platform") == ["1xCPU"]
        assert re.search(r"^--end-lr +0\.0002 +END_LR$", text, re.M), text[:3000]
        assert "data: found /data/train.rec and its .idx, /data/val.rec and its .idx" in text
        assert re.search(r"^RESULT,IMAGE_CLASSIFICATION,,\d+,", text, re.M)
    assert re.search(r"^c_1\.log +closed .* success ", out, re.M) and re.search(r"^c_2\.log +closed ", out, re.M)
    assert "no score: ResNet-50 is scored on exactly 5 runs, got 2" in out
    assert set(owners(logs).values()) == {NOBODY}


@pytest.mark.slow
def test_sigterm_reaches_training_in_the_container_and_the_next_launch_resumes_it(engine, three_classes, home):
    """SIGTERM to the launcher mid-epoch: the training in the container writes its checkpoint (in LOGDIR, through
    the mount, as nobody) and stops; the launcher waits for it, says so, leaves s.resume and exits 75, the trial's log
    holding the resumable_stop line. The next launch, in a new container, resumes from that checkpoint and ends with
    run_stop success."""
    logs = logdir(home)
    env = {**TINY_KEEP_CACHES, "NUM_CLASSES": "3", "DATADIR": data(three_classes, home), "LOGDIR": str(logs), "NEXP": "1",
           "SEED": "7", "DATESTAMP": "s", "NUMEPOCHS": "3", "EVAL_PERIOD": "3", "EVAL_OFFSET": "2", "DISP_BATCHES": "1",
           "RN50_CHECKPOINT_DIR": "/results/ckpt"}
    proc = past_the_first_step(launch(env, home, engine), logs / "s_1.log", home)
    proc.send_signal(signal.SIGTERM)
    status, out = finished(proc, home, timeout=300)
    assert status == 75, out[-3000:]
    assert "run_with_docker.sh: stopped by SIGTERM in trial 1 of 1: stopped, resumable; no further trial runs" in out
    deadline = time.time() + 300
    while engine.docker("ps", "-q").stdout.strip():  # the container ends once its checkpoint is written
        assert time.time() < deadline, engine.docker("ps").stdout
        time.sleep(0.5)
    steps = [name for name in files_in(logs / "ckpt") if name.startswith("step-")]
    assert len(steps) == 1, files_in(logs / "ckpt")
    assert mllog(logs / "s_1.log", "resumable_stop") == [f"/results/ckpt/{steps[0]}"]
    assert set(owners(logs).values()) == {NOBODY}, owners(logs)
    since = time.time()
    status, out = finished(launch({**env, "DATESTAMP": "s2"}, home, engine), home)
    assert status == 0, out[-4000:]
    image_id = engine.docker("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    assert containers_started(engine, since) == [image_id] * 4
    assert mllog(logs / "s2_1.log", "resumed_from") == [f"/results/ckpt/{steps[0]}"]
    assert (logs / "ckpt" / "finished").read_text() == "run_stop success\n"
    assert set(owners(logs).values()) == {NOBODY}, owners(logs)


@pytest.mark.slow
def test_a_killed_launcher_leaves_no_container_and_no_process(engine, three_classes, home):
    """SIGKILL to the launcher mid-trial (the OOM killer, a CI runner ending its job's first process), its training
    stopped too (SIGSTOP, as a rank stuck in a collective): the watcher removes the container, and no process of the
    launch runs. The old launcher left the container training, and two `docker run` clients, to the end: a killed
    client does not stop its container. (A trial still running STOP_GRACE s after a SIGTERM is ended by the same code,
    rn50_mx/launch.sh end_launch; tests/test_trials.py kills one.)"""
    logs = logdir(home)
    env = {**TINY_KEEP_CACHES, "NUM_CLASSES": "3", "DATADIR": data(three_classes, home), "LOGDIR": str(logs),
           "NEXP": "1", "DATESTAMP": "k", "NUMEPOCHS": "200", "ACCURACY_THRESHOLD": "1.0", "DISP_BATCHES": "1"}
    proc = past_the_first_step(launch(env, home, engine), logs / "k_1.log", home)
    launch_id = psutil.Process(proc.pid).environ()["RN50MX_LAUNCH"]
    # this launch's training: in its container (the suite's other container launches run beside it)
    [container] = engine.docker("ps", "-q", "--filter", f"label=rn50-mx.launch={launch_id}").stdout.split()
    init = int(engine.docker("inspect", "--format", "{{.State.Pid}}", container).stdout)
    [training] = [p for p, command in descendants(init).items() if command[1:3] == ["-m", "rn50_mx.train"]]
    clients = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "docker"]
    assert clients and engine.docker("ps", "-q").stdout.strip()
    training.send_signal(signal.SIGSTOP)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 120  # a loaded machine's engine, not a claim of speed
    while engine.docker("ps", "-aq", "--filter", f"label=rn50-mx.launch={launch_id}").stdout.strip():
        assert time.time() < deadline, engine.docker("ps", "-a").stdout
        time.sleep(0.2)
    assert not psutil.wait_procs([training, *clients], timeout=max(0.1, deadline - time.time()))[1]
    assert engine.docker("ps", "-aq").stdout.strip() == ""
    said = r"run_with_docker\.sh: process \d+ ended, \d+ process\(es\) and 1 container\(s\) of its launch still " \
           r"running: ended them"
    while not re.search(said, (home / "out.txt").read_text()):  # the watcher says so once it is done
        assert time.time() < deadline + 60, (home / "out.txt").read_text()[-2000:]
        time.sleep(0.2)


@pytest.mark.parametrize("case", ["no engine", "no image", "unreadable data"])
def test_what_stops_a_container_launch_is_one_line_before_any_trial(engine, three_classes, home, case):
    logs, folder = logdir(home), data(three_classes, home)
    env = {**TINY_KEEP_CACHES, "DATADIR": folder, "LOGDIR": str(logs), "NEXP": "1"}
    says = {"no engine": f"CONT={IMAGE}: the Docker engine does not answer (DOCKER_HOST=unix://{home}/none.sock)",
            "no image": "CONT=rn50-mx:absent: the engine has no such image: build it",
            "unreadable data": f"DATADIR={folder}: not readable by the launching user"}[case]
    if case == "no engine":
        env["DOCKER_HOST"] = f"unix://{home}/none.sock"
    elif case == "no image":
        env["CONT"] = "rn50-mx:absent"
    else:
        shutil.chown(folder, 0, 0)
        os.chmod(folder, 0o700)  # root's alone
    status, out = finished(launch(env, home, engine), home, timeout=120)
    lines = out.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith(f"run_with_docker.sh: {says}"), out
    assert files_in(logs) == []


# --- make image-cpu ------------------------------------------------------------------------------------------------

def wheel_dir(cache):
    """The Horovod wheel folder the Makefile names under `cache`."""
    rule = "print-wheel:\n\t@echo $(HOROVOD_WHEEL_DIR)\n"
    return subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, "-f", "Makefile", "-f", "-", "print-wheel",
                           f"CACHE={cache}"], input=rule, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["TERM", "KILL", "KILL to all"])
def test_a_stopped_image_build_leaves_no_process_and_no_partial_base(tmp_path, sig):
    """`make image-cpu` stopped while mmdebstrap builds the base (SIGTERM, as a CI job's cancel; SIGKILL, as the OOM
    killer) to make alone: within 10 s no process of the build runs and no partial base is left; a partial base an
    earlier build left (cpu-base-*.tar.tmp-*) is removed by the next build before mmdebstrap starts. The old recipe
    left mmdebstrap running under init and its partial base (up to 660 MB), which no later build removed. The cache is
    a folder of this test's, holding the machine's Horovod wheel (a link); no engine is needed before the base.
    "KILL to all": SIGKILL to every process of the build at once (a job's cgroup killed) while apt runs in the new
    root: nothing cleans up, but nothing stays mounted, so the next build's removal of the work folder succeeds (the
    mounts mmdebstrap made into the new root stayed, and every later build failed on them)."""
    wheel = wheel_dir(engine_support.CACHE)
    if not os.path.isdir(wheel) or shutil.which("mmdebstrap") is None:
        pytest.skip("needs the Horovod wheel `make venv` builds and mmdebstrap (the Makefile's Debian packages)")
    cache = tmp_path / "cache"
    cache.mkdir()
    os.symlink(wheel, wheel_dir(cache))
    stale = cache / "cpu-base-0123456789abcdef.tar.tmp-Ab12Cd.tar"
    stale.write_bytes(b"a partial base")
    make = subprocess.Popen(["make", "-C", ROOT, "image-cpu", f"CACHE={cache}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not any("mmdebstrap" in " ".join(cmdline[:2]) for cmdline in descendants(make.pid).values()):
            assert make.poll() is None and time.time() < deadline, make.stderr.read()
            time.sleep(0.1)
        assert not stale.exists() and len(list(cache.glob("cpu-base-*.tar.tmp-*"))) == 1
        if sig == "KILL to all":
            while not chrooted_under(cache, descendants(make.pid)):
                assert make.poll() is None and time.time() < deadline, make.stderr.read()
                time.sleep(0.2)
            tree = [psutil.Process(make.pid), *descendants(make.pid)]
            for process in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            assert_all_end(tree, timeout=10)
            assert not mounts_under(cache)
            work = list(cache.glob("cpu-base.work-*"))
            assert work and subprocess.run(["rm", "-rf", "--one-file-system", "--", *work]).returncode == 0
            return
        time.sleep(1)  # well under way: apt at work in the new root
        tree = list(descendants(make.pid))
        make.send_signal(getattr(signal, f"SIG{sig}"))
        assert_all_end(tree, timeout=10)
        assert make.wait(timeout=10) != 0
        # no partial base, no work folder (mmdebstrap's TMPDIR: the new root file system)
        assert sorted(path.name for path in cache.iterdir()) == ["cpu-base.lock", os.path.basename(wheel)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(make.pid, signal.SIGKILL)
        for mount in reversed(mounts_under(cache)):  # what a failure left: pytest's clean-up must never enter /sys
            subprocess.run(["umount", "--lazy", mount])


def chrooted_under(folder, processes):
    """Whether one of `processes` runs with its root inside `folder` (apt in mmdebstrap's new root)."""
    for process in processes:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{process.pid}/root").startswith(f"{folder}/"):
                return True
    return False


def mounts_under(folder):
    """The mount points of this mount namespace inside `folder` (/proc/self/mountinfo's fifth field)."""
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(f"{folder}/")]


# --- the README's container commands ------------------------------------------------------------------------------

def readme_commands():
    """The README's container commands for the data, the recipe and the rehearsal, as written: the two prep_rec runs,
    the RUN line and the $RUN commands of the recipe and the rehearsal."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    blocks = re.findall(r"^```\n(.*?)^```", text, re.M | re.S)
    prep = next(block for block in blocks if "prep_rec imagenet" in block)
    run = re.search(r'^RUN="docker run [^"]+"$', text, re.M).group(0)
    recipe = re.search(r"^\$RUN python -m rn50_mx\.recipe .*$", text, re.M).group(0)
    rehearse = re.search(r"^\$RUN bash -c 'source config/MYBOX\.sh && python -m rn50_mx\.rehearse.*$", text, re.M)
    return prep.strip(), run, recipe, rehearse.group(0)


def test_the_readme_shows_the_commands_this_file_runs():
    """The commands test_the_readmes_container_commands_run_with_the_cpu_image runs are read from the README: they
    are there, in the order a user runs them, each container run as the launching user."""
    prep, run, recipe, rehearse = readme_commands()
    assert prep.startswith("docker run --rm -u $(id -u):$(id -g) -v /raw/imagenet:/raw:ro -v /raid/imagenet-rec:/out ")
    assert "prep_rec verify /out/val" in prep and "-u $(id -u):$(id -g)" in run
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert text.index(prep) < text.index(run) < text.index(recipe) < text.index(rehearse)


@pytest.mark.slow
def test_the_readmes_container_commands_run_with_the_cpu_image(engine, home):
    """The README's commands as written, as nobody, with the CPU image for `rn50-mx`, a small ImageNet in the
    official layout for /raw/imagenet (read-only), folders here for /raid/imagenet-rec, the checkout's config/ and
    results/, and its 5 classes for ImageNet's 1000; no --gpus. The records pass verify, the recipe writes
    config/MYBOX.sh through the mount and that GPU config rehearses in the image; everything written is nobody's."""
    from tests.support import imagenet_archives

    raw = imagenet_archives.write_archives(imagenet_archives.make(per_class=2, val_images=5), home / "raw")
    rec, work = home / "rec", home / "work"
    for folder in (rec, work, work / "results"):
        folder.mkdir()
        shutil.chown(folder, NOBODY, NOBODY)
    shutil.copytree(home / "checkout" / "config", work / "config")
    for path in [work / "config", *(work / "config").iterdir()]:
        shutil.chown(path, NOBODY, NOBODY)
    # What the README names and this machine has elsewhere.
    places = {"/raw/imagenet:": f"{raw}:", "/raid/imagenet-rec:": f"{rec}:", "$PWD/config:": f"{work}/config:",
              "$PWD/results:": f"{work}/results:", " rn50-mx ": f" {IMAGE} ", " rn50-mx \\": f" {IMAGE} \\",
              ' rn50-mx"': f' {IMAGE}"', "--num-classes 1000": "--num-classes 5", "--gpus all ": ""}
    script = "set -euo pipefail\n" + "\n".join(readme_commands())
    for written, here in places.items():
        script = script.replace(written, here)
    status, out = finished(as_nobody(script, home, engine), home, timeout=900)
    assert status == 0, script + "\n" + out[-4000:]
    assert files_in(rec) == ["train.idx", "train.lst", "train.rec", "val.idx", "val.lst", "val.rec"]
    assert "wrote config/MYBOX.sh" in out and "MYBOX.sh" in files_in(work / "config")
    assert re.search(r"^train +ok ", out, re.M), out[-3000:]
    for folder in (rec, work):
        assert set(owners(folder).values()) == {NOBODY}, owners(folder)

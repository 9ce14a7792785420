"""The tests' shared fixtures: small JPEG class folders cut from Fashion-MNIST, and their packed .rec (the helpers
are in tests/support/); and the suite's cost profile (tests/support/costs.py), printed at the end of every run."""
import os
import shutil
import signal

import pytest

from tests.support.procs import SHARED_CORES

os.environ.update(SHARED_CORES)  # before MXNet loads (libgomp reads it once): this process and what it starts
# A suite started in the background by a non-interactive shell (`make test &` in a script, nohup) inherits SIGINT
# ignored, and so would every process it starts: a shell that starts with a signal ignored cannot trap it (POSIX), so
# the launchers' Ctrl-C paths could not run, and their tests failed (the launcher hung, or died of SIGINT at -2).
# Ctrl-C comes back here, for this process and, at exec, for what it starts.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from rn50_mx import prep_rec  # noqa: E402  (MXNet loads here, after the line above)
from tests.support import schedule  # noqa: E402
from tests.support.costs import Profile  # noqa: E402
from tests.support.data import packed_train_val, write_jpeg_tree  # noqa: E402
from tests.support.procs import ROOT, Reaper, run_train  # noqa: E402
from tests.support.settings import STOPPED_RUN  # noqa: E402


def pytest_configure(config):
    config.pluginmanager.register(Profile(config), "rn50-cost-profile")
    config.pluginmanager.register(Reaper(), "rn50-reaper")  # what a test's call left running: tests/support/procs.py
    if config.pluginmanager.hasplugin("xdist"):  # make test's distribution: tests/support/schedule.py
        config.pluginmanager.register(schedule.Distribution(config), "rn50-distribution")


@pytest.fixture(scope="session")
def jpeg_tree(tmp_path_factory):
    """A tree of 3 classes x 7 JPEGs; tests must not modify it (copy it first)."""
    return write_jpeg_tree(tmp_path_factory.mktemp("jpegs"))


@pytest.fixture(scope="session")
def small_rec(jpeg_tree, tmp_path_factory):
    """`jpeg_tree` packed without shuffling: PREFIX.rec/.idx/.lst with 21 records, labels 0..2."""
    prefix = str(tmp_path_factory.mktemp("rec") / "small")
    prep_rec.pack(jpeg_tree, prefix, shuffle=False)
    return prefix


@pytest.fixture(scope="session")
def three_classes(tmp_path_factory):
    """DATADIR of a tiny Fashion-MNIST set: train.rec (3 classes x 8 photographs at 32x32) and val.rec (4 of
    each, with their labels), for whole training runs of seconds."""
    root = tmp_path_factory.mktemp("three_classes")
    prep_rec.write_fashion_mnist_jpegs("train", str(root / "train"), size=32, per_class=8)
    for name in sorted(os.listdir(root / "train")):
        if name not in ("1_trouser", "5_sandal", "8_bag"):
            shutil.rmtree(root / "train" / name)
        else:
            os.makedirs(root / "val" / name)
            for image in sorted(os.listdir(root / "train" / name))[:4]:
                shutil.copy(root / "train" / name / image, root / "val" / name / image)
    prep_rec.pack(str(root / "train"), str(root / "data" / "train"))
    prep_rec.pack(str(root / "val"), str(root / "data" / "val"), shuffle=False)
    return str(root / "data")


@pytest.fixture
def config_dir(tmp_path):
    """A config folder with the shared common file the recipe's configs source."""
    shutil.copy(os.path.join(ROOT, "config", "gpu_common.sh"), tmp_path)
    return tmp_path


@pytest.fixture
def tiny_data(tmp_path):
    """train.rec/.idx and val.rec/.idx of 5 classes x 7 real photographs."""
    return packed_train_val(str(tmp_path))[1]


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    """A JPEG tree and its packed train/val set (5 classes x 7), shared by every probe and trial that only reads
    them."""
    jpegs, data = packed_train_val(str(tmp_path_factory.mktemp("hostile")))
    return dict(jpegs=jpegs, data=data)


@pytest.fixture(scope="session")
def stopped_checkpoints(tmp_path_factory):
    """A checkpoint folder as a stopped run leaves it (tests must copy it): the checkpoint after epoch 1 of a tiny
    synthetic run of 2 (the last epoch writes none), the mark that its run ended removed."""
    folder = tmp_path_factory.mktemp("stopped") / "ckpt"
    result = run_train([*STOPPED_RUN, "--checkpoint-dir", str(folder), "--checkpoint-every", "1"])
    assert result.returncode == 0, result.stderr[-2000:]
    os.remove(folder / "finished")
    return str(folder)


@pytest.fixture(scope="session")
def docker_engine():
    """A private Docker engine for the session (tests/support/engine.py), which the launching user `nobody` reaches;
    the tests that need it are skipped, in one line, where none can start. Images are each test module's to add."""
    from tests.support import engine
    reason = engine.why_no_engine()
    if reason:
        pytest.skip(f"no container tests: {reason}")
    private = engine.Engine()
    reason = private.start()
    if reason:
        pytest.skip(f"no container tests: {reason}")
    try:
        os.chmod(private.dir, 0o711)  # a launcher run as nobody reaches the socket
        os.chmod(private.socket, 0o666)
        yield private
    finally:
        private.stop()

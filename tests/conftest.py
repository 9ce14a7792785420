"""Shared real data for the tests: small JPEG class folders cut from Fashion-MNIST, and their packed .rec."""
import os
import shutil
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from rn50_mx import prep_rec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The python of this test run, and its horovodrun, come first on PATH: the scripts call `python`.
ENV_PATH = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
# A PYTHONPATH the tests run with (a worktree's checkout instead of the installed one) reaches the scripts too.
PYTHONPATH = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}


# What the compliance checker says of a short run's log whose structure is right: only the target is missing.
CHECKER_ON_A_SHORT_RUN = ("FAILED", "Failed checks for eval_accuracy : v['value'] >= 0.7590 and v['value'] < 1.0")

CLASSES = ("ankle_boot", "bag", "coat")  # sorted, so labels are 0, 1, 2
PER_CLASS = 7


def write_jpeg_tree(root, classes=CLASSES, per_class=PER_CLASS, seed=0):
    """Class folders of real photographs (Fashion-MNIST, upscaled to varied sizes) saved as JPEG."""
    images, _ = prep_rec.load_fashion_mnist("train")
    rng = np.random.RandomState(seed)
    for c, name in enumerate(classes):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            grey = images[c * per_class + i]
            w, h = int(rng.randint(40, 97)), int(rng.randint(40, 97))
            rgb = Image.fromarray(grey).convert("RGB").resize((w, h), Image.BILINEAR)
            rgb.save(os.path.join(root, name, f"img{i:03d}.jpg"), quality=90)
    return str(root)


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


def wait_for(proc, out, pattern, timeout=240):
    """Until `pattern` is in the file `out` that `proc` (or a child of it) writes, a file not there yet read as
    empty; a process that ends first or a timeout fails the test, and its group is killed (start `proc` with
    start_new_session=True)."""
    def text():
        return open(out).read() if os.path.exists(out) else ""

    deadline = time.time() + timeout
    while not re.search(pattern, text(), re.M):
        if proc.poll() is not None or time.time() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"never saw {pattern!r}: " + text()[-3000:])
        time.sleep(0.1)


def bash(script, env=None, cwd=ROOT, timeout=120):
    """Run `script` with bash -c in a clean environment (plus `env`); returns the CompletedProcess."""
    full_env = {"PATH": ENV_PATH, "HOME": os.environ.get("HOME", "/tmp"), **PYTHONPATH, **(env or {})}
    return subprocess.run(["bash", "-c", script], env=full_env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def sourced(system, command, env=None, **kwargs):
    """`command` after `source config/<system>.sh`, with the environment `env` exported after the config."""
    exports = "".join(f"export {name}={value!r}; " for name, value in (env or {}).items())
    return bash(f"set -euo pipefail; source config/{system}.sh; {exports}{command}", **kwargs)


def assert_one_line_naming(result, name):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert name in lines[0] and "Traceback" not in result.stderr
    assert "RESULT," not in result.stdout


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

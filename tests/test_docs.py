"""The docs say what the code does: every module and flag they name exists, the tools' help is whole, and the
README's GPU path runs in the image and leaves the configs on the host."""
import glob
import os
import re
import shutil
import subprocess

import pytest

from tests.support.procs import ENV_PATH, ROOT


DOCS = glob.glob(os.path.join(ROOT, "*.md")) + glob.glob(os.path.join(ROOT, "docs", "*.md"))


def test_every_module_the_docs_and_messages_name_exists():
    """`python -m rn50_mx.X` in the README, the scripts and the package's own messages names a module that is
    there (the self-test once pointed to a tuner that was not)."""
    import importlib.util

    paths = glob.glob(os.path.join(ROOT, "rn50_mx", "**", "*.py"), recursive=True) + glob.glob(
        os.path.join(ROOT, "*.sh")) + DOCS + [os.path.join(ROOT, "Makefile")]
    named = set()
    for path in paths:
        with open(path) as f:
            named |= set(re.findall(r"python -m (rn50_mx(?:\.\w+)*)", f.read()))
    assert {"rn50_mx.train", "rn50_mx.prep_rec", "rn50_mx.selftest"} <= named
    assert [name for name in sorted(named) if importlib.util.find_spec(name) is None] == []


@pytest.mark.parametrize("module", ["rn50_mx.selftest", "rn50_mx.tune"])
def test_tool_help_is_whole_and_names_the_data_flags(module):
    result = subprocess.run([shutil.which("python", path=ENV_PATH), "-m", module, "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    text = " ".join(result.stdout.split())
    description = text.split("options:")[0]
    assert result.returncode == 0 and description.rstrip().endswith(".")
    assert "--data-train DIR/train.rec --data-val DIR/val.rec (or DATADIR" in text


def test_every_flag_the_docs_show_is_one_the_tool_takes():
    """Each `--flag` of a `python -m rn50_mx.X ...` command in the README and docs/ is in that tool's --help (for
    prep_rec, its subcommand's): a renamed or removed flag fails here, not in a GPU owner's first hour."""
    helps, missing = {}, []
    for path in DOCS:
        with open(path) as f:
            for module, rest in re.findall(r"python -m (rn50_mx[.\w]*)([^`|;\n#']*)", f.read()):
                words = rest.split()
                sub = words[:1] if module == "rn50_mx.prep_rec" and words and not words[0].startswith("-") else []
                key = (module, *sub)
                if key not in helps:
                    done = subprocess.run([shutil.which("python", path=ENV_PATH), "-m", *key, "--help"], cwd=ROOT,
                                          capture_output=True, text=True, timeout=120)
                    helps[key] = done.stdout + done.stderr
                missing += [(os.path.basename(path), *key, w) for w in words
                            if re.fullmatch(r"--[a-z][-a-z0-9]*", w)
                            and not re.search(rf"(?<![-\w]){w}(?![-\w])", helps[key])]
    assert missing == []


def test_the_readmes_gpu_path_runs_in_the_image_and_leaves_the_configs_on_the_host():
    """The README's GPU path, top to bottom: the image, the data prepared in it, the recipe for an H100 box, the
    tuner, the self-test, the runs and the scoring, in that order; the container commands mount the checkout's
    config/ where the image's tools write it (WORKDIR/config: the tuner's default --out), so that the recipe's
    config and the tuner's fragment land where the launchers on the host look."""
    from rn50_mx import tune

    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    steps = ["docker build -t rn50-mx .", "rn50-mx \\\n  python -m rn50_mx.prep_rec imagenet",
             "$RUN python -m rn50_mx.recipe --nodes 1 --gpus-per-node 4 --gpu H100", "python -m rn50_mx.tune",
             "python -m rn50_mx.selftest --data-train", "./run_with_docker.sh", "$RUN python -m rn50_mx.timing",
             "sbatch"]
    places = [readme.find(step) for step in steps]
    assert -1 not in places and places == sorted(places), dict(zip(steps, places))
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        dockerfile = f.read()
    workdir = re.search(r"^WORKDIR (\S+)$", dockerfile, re.M).group(1)
    assert "COPY rn50_mx/ rn50_mx/" in dockerfile.split(f"WORKDIR {workdir}")[1]
    assert f"-v $PWD/config:{workdir}/config " in re.search(r'^RUN="docker run [^"]+"$', readme, re.M).group(0)
    assert tune.parse_args([])[0].out == os.path.join(tune.ROOT, "config") and tune.ROOT == ROOT

"""The Docker image and what the code runs on: the Dockerfile copies what .dockerignore lets through, its build
check fails on a stack without the GPU path or with a module that cannot import, the package runs on the image's
Python, the image installs every package the code imports at pins that resolve to wheels on PyPI, and `make` picks
a Python that can run MXNet 1.9.1."""
import ast
import glob
import json
import os
import re
import shutil
import subprocess
import sys


from tests.support.procs import ENV_PATH, ROOT


def test_dockerfile_copies_only_existing_paths_that_dockerignore_lets_through():
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        sources = [src for line in f if line.startswith("COPY ") for src in line.split()[1:-1]]
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        allowed = {line[1:].strip().rstrip("/") for line in f if line.startswith("!")}
    assert sources and all(os.path.exists(os.path.join(ROOT, src)) for src in sources)
    assert {src.rstrip("/") for src in sources if src != "./"} <= allowed


def dockerfile_stack_check():
    """The command the Dockerfile's build-time check runs (after `python -m`) with its build arguments' defaults, the
    GPU image's (the CPU image empties EXPECT_GPU)."""
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        text = f.read()
    defaults = dict(re.findall(r"^ARG (\w+)=(\S*)$", text, re.M))
    command = re.search(r"python -m (rn50_mx\.selftest [^;\n]*)", text).group(1)
    return re.sub(r"\$\{(\w+)\}", lambda arg: defaults[arg.group(1)], command).split()


def test_the_image_build_check_fails_on_a_stack_without_the_gpu_path():
    """The build check, run on this CPU stack, must fail and name what the GPU path lacks; the stack table alone
    passes (it is informational without --expect-gpu)."""
    command = dockerfile_stack_check()
    assert "--expect-gpu" in command and "--stack-only" in command
    result = subprocess.run([shutil.which("python", path=ENV_PATH), "-m", *command], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert " FAIL " in rows["mxnet"] and "CUDA no" in rows["mxnet"] and " FAIL " in rows["horovod"]
    assert "FAILED: mxnet, horovod" in result.stdout and "dali" not in result.stdout.split("FAILED:")[1]
    command.remove("--expect-gpu")
    result = subprocess.run([shutil.which("python", path=ENV_PATH), "-m", *command], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "all checks passed" in result.stdout, result.stdout + result.stderr


VERMIN = shutil.which("vermin", path=ENV_PATH)


def image_python():
    """The Python of the image's base ("3.10"): the Dockerfile's IMAGE_PYTHON, which its build checks."""
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        return re.search(r"^ARG IMAGE_PYTHON=(\d+\.\d+)$", f.read(), re.M).group(1)


def test_the_package_runs_on_the_images_python(tmp_path):
    """vermin finds nothing in rn50_mx newer than the image's Python, and does find a method one release newer."""
    major, minor = image_python().split(".")
    check = [VERMIN, f"-t={major}.{minor}-", "--violations", "--eval-annotations", "--no-tips", "--no-parse-comments"]
    result = subprocess.run([*check, "rn50_mx"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    newer = {"3.10": "import datetime\nprint(datetime.UTC)\n"}  # new in 3.11
    (tmp_path / "newer.py").write_text(newer[image_python()])
    assert subprocess.run([*check, str(tmp_path / "newer.py")], capture_output=True).returncode != 0


# The NGC MXNet image's own packages, which the Dockerfile keeps (pip --no-deps); and the distribution of each other
# package rn50_mx imports.
IMAGE_PROVIDES = {"mxnet", "numpy", "horovod"}
DISTRIBUTIONS = {"PIL": "pillow", "nvidia": "nvidia-dali-cuda120", "mlperf_logging": "mlperf-logging",
                 "scipy": "scipy", "tqdm": "tqdm", "optuna": "optuna", "matplotlib": "matplotlib"}
OPTIONAL = set()  # every package imported is in the image (matplotlib: the search's picture, timing --plot)


def third_party_imports():
    """The top-level names of the packages rn50_mx imports (absolute imports, not the standard library's)."""
    names = set()
    for path in glob.glob(os.path.join(ROOT, "rn50_mx", "**", "*.py"), recursive=True):
        with open(path) as f:
            for node in ast.walk(ast.parse(f.read())):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"rn50_mx"}


def constraints_for(python):
    """constraints.txt's requirements whose markers hold on `python` ("3.10")."""
    from packaging.requirements import Requirement

    with open(os.path.join(ROOT, "constraints.txt")) as f:
        pins = [Requirement(line) for line in f.read().splitlines() if line and not line.startswith("#")]
    env = {"python_version": python, "python_full_version": python + ".0", "sys_platform": "linux",
           "platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    return [p for p in pins if p.marker is None or p.marker.evaluate(env)]


def image_pins():
    """{name: requirement} of the pins the Dockerfile's pip line installs (its grep of constraints.txt), for the
    image's Python."""
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        names = re.search(r'grep -iE "\^\(([^)]+)\)=="', f.read()).group(1).lower().split("|")
    pins = {p.name.lower(): p for p in constraints_for(image_python())}
    return {name: pins.get(name) for name in names}


def test_the_image_installs_every_package_the_code_imports():
    """The image's pip line installs, at one exact pin for its Python, each package rn50_mx imports that the NGC
    image does not have (the build check then imports every module: test_the_build_check_fails_when_a_module...)."""
    assert third_party_imports() == IMAGE_PROVIDES | set(DISTRIBUTIONS) | OPTIONAL, "a new import: where from?"
    pins = image_pins()
    assert set(DISTRIBUTIONS.values()) <= set(pins)
    for name, pin in pins.items():
        assert pin is not None and str(pin.specifier).startswith("=="), name


# Where CI's pip finds packages: PyPI, or the index pip is told to use (PIP_INDEX_URL); never a local folder or an
# extra index (pip --isolated ignores pip.conf's find-links and extra-index-url).
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")


def resolve(requirements, constraints, python, tmp_path):
    """(exit code, {name: (version, file name)}, stderr) of pip's resolver for the image: wheels only, for
    CPython `python` on manylinux x86_64 up to glibc 2.35 (Ubuntu 22.04), on INDEX alone. --dry-run with --report
    reads each wheel's metadata (PEP 658) without downloading it."""
    major, minor = python.split(".")
    platforms = [f"--platform=manylinux_2_{glibc}_x86_64" for glibc in range(5, 36)] + [
        "--platform=manylinux2014_x86_64", "--platform=manylinux2010_x86_64", "--platform=manylinux1_x86_64"]
    # pip evaluates markers for the Python it runs on, not --python-version: they go, already evaluated
    (tmp_path / "constraints.txt").write_text("".join(f"{c.name}{c.specifier}\n" for c in constraints))
    report = tmp_path / "report.json"
    command = [shutil.which("python", path=ENV_PATH), "-m", "pip", "install", "--isolated", "--index-url", INDEX,
               "--dry-run", "--ignore-installed", "--only-binary=:all:", "--implementation=cp",
               f"--python-version={python}", f"--abi=cp{major}{minor}", *platforms, "--target", str(tmp_path / "t"),
               "--report", str(report), "--quiet", "-c", str(tmp_path / "constraints.txt"),
               *(f"{r.name}{r.specifier}" for r in requirements)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        return result.returncode, {}, result.stderr
    with open(report) as f:
        installs = json.load(f)["install"]
    return 0, {i["metadata"]["name"].lower(): (i["metadata"]["version"], i["download_info"]["url"].rsplit("/", 1)[-1])
               for i in installs}, result.stderr


def test_the_images_pins_resolve_to_wheels_on_pypi(tmp_path):
    """What the Dockerfile's pip line installs (its pins and all they pull in, with constraints.txt) resolves on
    the package index CI uses, as wheels for the image's Python, at the pinned versions; and every package it
    pulls in is pinned too."""
    python = image_python()
    pins = image_pins()
    constraints = constraints_for(python)
    code, found, stderr = resolve(pins.values(), constraints, python, tmp_path)
    assert code == 0, stderr
    pinned = {c.name.lower(): str(c.specifier)[2:] for c in constraints}
    assert {name: found[name][0] for name in pins} == {name: pinned[name] for name in pins}
    assert all(wheel.endswith(".whl") for _, wheel in found.values())
    assert {name: version for name, (version, _) in found.items() if pinned.get(name) != version} == {}


def test_a_pin_that_only_nvidias_index_has_does_not_resolve(tmp_path):
    """The old image's DALI (CUDA 11, NVIDIA's index) does not resolve on PyPI for the image's Python: the check
    above would fail on it. The release before it on PyPI does."""
    from packaging.requirements import Requirement

    code, _, stderr = resolve([Requirement("nvidia-dali-cuda110==1.48.0")], [], image_python(), tmp_path)
    assert code != 0 and "No matching distribution found for nvidia-dali-cuda110==1.48.0" in stderr


def test_the_build_check_fails_when_a_module_cannot_import():
    """The image lacking a package that only training or the tools import (here Pillow, hidden) fails the build
    check, naming the module."""
    hide_pil = ("import runpy, sys; sys.modules['PIL'] = None; sys.argv[0] = 'selftest'; "
                "runpy.run_module('rn50_mx.selftest', run_name='__main__')")
    result = subprocess.run([shutil.which("python", path=ENV_PATH), "-c", hide_pil, "--stack-only"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert result.returncode == 1 and " FAIL " in rows["rn50_mx"]
    assert re.search(r"rn50_mx\.[\w.]+: ModuleNotFoundError: import of PIL halted", rows["rn50_mx"])


def test_make_builds_the_venv_with_a_supported_python_or_says_which_work(tmp_path):
    """MXNet 1.9.1 needs numpy < 1.24, which has no wheels for Python 3.12+: with only a 3.12 on PATH, `make` stops
    in one line naming the Pythons that work and the two ways on, before creating anything; with a 3.11 beside it,
    the venv is made with the 3.11."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text('#!/bin/bash\n[ "$1" = -c ] && echo 3.12\n')  # answers like a Python 3.12
    (fake / "python3").chmod(0o755)
    venv = tmp_path / "venv"
    make = [shutil.which("make"), "-C", ROOT, f"VENV={venv}", f"{venv}/.base"]
    result = subprocess.run(make, env={"PATH": str(fake)}, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and not venv.exists()
    assert result.stderr.splitlines()[0].startswith("make: rn50-mx needs Python 3.10 or 3.11 (MXNet 1.9.1 needs numpy "
                                                    "< 1.24, which has no wheels for 3.12 or newer)")
    assert "install python3.11" in result.stderr and "docker build -t rn50-mx ." in result.stderr
    os.symlink(os.path.realpath(sys.executable), fake / "python3.11")  # the venv's own 3.11
    planned = subprocess.run([make[0], "-n", *make[1:]], env={"PATH": str(fake)}, capture_output=True, text=True,
                             timeout=60)
    assert f"python3.11 -m venv {venv}" in planned.stdout

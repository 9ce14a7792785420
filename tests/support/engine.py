"""A private Docker engine for the container tests, and the CPU image in it. The engine is Debian's dockerd (the
Makefile installs docker.io) started by hand with a data root, an exec root and a socket of its own in a temporary
folder, no iptables and no bridge (the containers use the host's network), and stopped by pid: no other daemon is
used or touched. Its storage driver is overlay2 where the kernel has overlayfs (each container a thin layer), else
vfs (each layer a full copy).

The image is built once a run with `make image-cpu` and kept in CACHE as `docker save` output named by the hash of
everything the build reads (the Dockerfile, what .dockerignore lets into the context, and the base: the Makefile's
hash of its inputs); a later run whose inputs hash the same loads it instead of building.
"""
import hashlib
import os
import shutil
import subprocess
import tempfile
import time

from tests.support.procs import ROOT

DOCKERD, DOCKER = "/usr/sbin/dockerd", "/usr/bin/docker"  # Debian's docker.io: whatever other `docker` PATH has
IMAGE = "rn50-mx:cpu"
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rn50-mx")
# What the image is built from: the Dockerfile's context (.dockerignore's list) and the recipe of its base.
INPUTS = ("Dockerfile", ".dockerignore", "setup.py", "constraints.txt", "rn50_mx", "run_and_time.sh", "config")


def why_no_engine():
    """The reason the container tests cannot run here (None when a private engine can start): root is needed, and
    Debian's docker.io, installed through the Makefile when apt-get is here."""
    if os.geteuid() != 0:
        return "a private dockerd needs root"
    if not os.path.exists(DOCKERD) or not os.path.exists(DOCKER):
        if shutil.which("apt-get") is None:
            return "no dockerd, and no apt-get to install docker.io (the Makefile's Debian packages)"
        subprocess.run(["make", "-C", ROOT, DOCKERD], check=True, capture_output=True)
    return None


class Engine:
    """dockerd in a temporary folder: `env` holds the DOCKER_HOST that names it."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="rn50-docker-")
        self.socket = os.path.join(self.dir, "docker.sock")
        self.env = {"DOCKER_HOST": "unix://" + self.socket}
        self.proc = None

    def start(self):
        """Starts dockerd and waits until it answers; returns None, or the reason it could not start (its log's last
        line)."""
        with open("/proc/filesystems") as f:
            driver = "overlay2" if "\toverlay\n" in f.read() else "vfs"
        log = open(os.path.join(self.dir, "dockerd.log"), "w")
        self.proc = subprocess.Popen(
            [DOCKERD, "--iptables=false", "--ip6tables=false", "--bridge=none", f"--storage-driver={driver}",
             "--data-root", os.path.join(self.dir, "data"), "--exec-root", os.path.join(self.dir, "exec"),
             "--pidfile", os.path.join(self.dir, "dockerd.pid"), "-H", self.env["DOCKER_HOST"]],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 60
        while self.docker("version").returncode != 0:
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                with open(log.name) as f:
                    lines = f.read().strip().splitlines() or ["no output"]
                return f"dockerd did not start: {lines[-1]}"
            time.sleep(0.5)
        return None

    def docker(self, *args, timeout=120, **kwargs):
        return subprocess.run([DOCKER, *args], env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, **kwargs)

    def stop(self):
        """Stops dockerd (it stops its containers and its containerd), unmounts what it left and removes the folder."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        with open("/proc/mounts") as f:
            mounts = [line.split()[1] for line in f if line.split()[1].startswith(self.dir + "/")]
        for mount in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def inputs_key():
    """The hash of every file the image is built from (path and bytes) and of its base (the Makefile's hash of the
    base's inputs)."""
    base = subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, "cpu-base-key"], capture_output=True,
                          text=True, check=True).stdout
    digest = hashlib.sha256(base.encode())
    for top in INPUTS:
        paths = [top] if os.path.isfile(os.path.join(ROOT, top)) else sorted(
            os.path.relpath(os.path.join(folder, name), ROOT)
            for folder, dirs, names in os.walk(os.path.join(ROOT, top)) if "__pycache__" not in folder
            for name in names if not name.endswith(".pyc"))
        for path in paths:
            with open(os.path.join(ROOT, path), "rb") as f:
                digest.update(path.encode() + b"\0" + f.read() + b"\0")
    return digest.hexdigest()[:16]


def cpu_image(engine):
    """IMAGE in `engine`: loaded from CACHE when an image of the same inputs is there, else built with `make
    image-cpu` and saved there (replacing the images of other inputs). Returns how it came ("loaded" or "built")
    and the seconds it took."""
    start = time.time()
    folder = os.path.join(CACHE, "images")
    saved = os.path.join(folder, f"rn50-mx-cpu-{inputs_key()}.tar")
    if os.path.exists(saved):
        done = engine.docker("load", "-i", saved, timeout=900)
        assert done.returncode == 0, done.stderr
        return "loaded", time.time() - start
    built = subprocess.run(["make", "-C", ROOT, "image-cpu", f"DOCKER={DOCKER}", f"CPU_IMAGE={IMAGE}"],
                           env={**os.environ, **engine.env}, capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    os.makedirs(folder, exist_ok=True)
    for old in os.listdir(folder):
        os.remove(os.path.join(folder, old))
    done = engine.docker("save", "-o", saved + ".tmp", IMAGE, timeout=900)
    assert done.returncode == 0, done.stderr
    os.rename(saved + ".tmp", saved)
    return "built", time.time() - start


def import_small_image(engine, name, folder):
    """An image `name` in `engine` that holds one empty file and no python (`docker import`): another image to tag
    with a name, or an image that cannot run rn50_mx."""
    import tarfile
    tar = os.path.join(folder, "small-image.tar")
    with tarfile.open(tar, "w") as f:
        f.addfile(tarfile.TarInfo("hello"))
    done = engine.docker("import", tar, name)
    assert done.returncode == 0, done.stderr

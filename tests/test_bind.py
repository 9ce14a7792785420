"""CPU binding of ranks (bind.py through the launchers' numactl line): as the reference binds on its machine, to the
cores and memory of each rank's GPU on a DGX A100, by rank order when the GPU's place is unknown, and not at all
with fewer cores than ranks."""
import os
import re
import shutil
import subprocess

import pytest

from tests.support.procs import ENV_PATH, ROOT


def fake_tools(tmp_path):
    """A PATH whose lscpu describes the NF5688M6 (2 sockets x 32 cores x 2 threads, CPU i and i+64 on core i)
    and whose numactl prints its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rows = "\n".join(f"{cpu},{cpu % 64},{cpu % 64 // 32}" for cpu in range(128))
    (bin_dir / "lscpu").write_text(f"#!/bin/sh\ncat <<'EOF'\n# CPU,Core,Node\n{rows}\nEOF\n")
    (bin_dir / "numactl").write_text('#!/bin/sh\nwhile [ "$1" != "${1#--}" ]; do shift; done\nexec "$@"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return str(bin_dir) + os.pathsep + ENV_PATH


@pytest.mark.parametrize("rank,cpus,node", [(0, "0-7,64-71", 0), (7, "56-63,120-127", 1)])
def test_ranks_are_bound_like_the_reference(tmp_path, rank, cpus, node):
    """The reference's NF5688M6 log: rank 0 -> --physcpubind=0-7,64-71 --membind=0, rank 7 -> 56-63,120-127, 1."""
    result = subprocess.run(["bash", "run_and_time.sh", "--rank", "true"], cwd=ROOT, capture_output=True,
                            text=True, env={"PATH": fake_tools(tmp_path), "DGXNGPU": "8", "LOCAL_RANK": str(rank)})
    assert result.returncode == 0, result.stderr
    bound = re.search(r"--physcpubind=(\S+) --membind=(\d+)", result.stdout)
    low, high = (int(v) for v in cpus.split(",")[0].split("-"))
    expected = sorted(list(range(low, high + 1)) + [cpu + 64 for cpu in range(low, high + 1)])
    assert sorted(int(cpu) for cpu in bound.group(1).split(",")) == expected and int(bound.group(2)) == node


def dgx_a100(tmp_path, numa_node=True):
    """A DGX A100 in NPS4 mode: 2 x 64 cores x 2 threads in 8 NUMA nodes of 16 cores (CPU i and i+128 on core i),
    GPUs 0-7 on nodes 3, 3, 1, 1, 7, 7, 5, 5; nvidia-smi and sysfs say where each GPU is (numa_node -1 and only
    local_cpulist when `numa_node` is False, as some BIOSes leave it)."""
    path = fake_tools(tmp_path)
    rows = "\n".join(f"{cpu},{cpu % 128},{cpu % 128 // 16}" for cpu in range(256))
    (tmp_path / "bin" / "lscpu").write_text(f"#!/bin/sh\ncat <<'EOF'\n# CPU,Core,Node\n{rows}\nEOF\n")
    buses = ["07", "0f", "47", "4e", "87", "90", "b7", "bd"]
    smi = "\n".join(f"{i}, 00000000:{bus.upper()}:00.0" for i, bus in enumerate(buses))
    (tmp_path / "bin" / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{smi}\nEOF\n")
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    for bus, node in zip(buses, (3, 3, 1, 1, 7, 7, 5, 5)):
        device = tmp_path / "sys" / "bus" / "pci" / "devices" / f"0000:{bus}:00.0"
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{node if numa_node else -1}\n")
        first = node * 16
        (device / "local_cpulist").write_text(f"{first}-{first + 15},{first + 128}-{first + 143}\n")
    return {"PATH": path, "DGXNGPU": "8", "NUMA_SYSFS_ROOT": str(tmp_path / "sys")}


def bound(env, rank):
    result = subprocess.run(["bash", "run_and_time.sh", "--rank", "true"], cwd=ROOT, capture_output=True,
                            text=True, env={**env, "LOCAL_RANK": str(rank)})
    assert result.returncode == 0, result.stderr
    found = re.search(r"--physcpubind=(\S+) --membind=(\d+)", result.stdout)
    return found.group(1), int(found.group(2))


@pytest.mark.parametrize("numa_node", [True, False])
def test_ranks_are_bound_to_the_cores_and_memory_of_their_gpu(tmp_path, numa_node):
    """GPUs 0 and 1 of a DGX A100 share NUMA node 3 (cores 48-63): rank 0 gets its first 8 cores, rank 1 the
    other 8, each with their siblings; rank order alone would have put rank 0 on node 0, a socket away."""
    env = dgx_a100(tmp_path, numa_node)
    assert bound(env, 0) == ("48,176,49,177,50,178,51,179,52,180,53,181,54,182,55,183", 3)
    assert bound(env, 1) == ("56,184,57,185,58,186,59,187,60,188,61,189,62,190,63,191", 3)
    assert bound(env, 4)[1] == 7
    assert bound({**env, "CUDA_VISIBLE_DEVICES": "6,7"}, 0)[1] == 5  # rank 0 on GPU 6


def test_an_unknown_gpu_place_falls_back_to_rank_order(tmp_path):
    env = dgx_a100(tmp_path)
    shutil.rmtree(tmp_path / "sys")
    assert bound(env, 1) == (",".join(f"{c},{c + 128}" for c in range(16, 32)), 1)


def test_one_core_per_rank_is_too_few_to_bind(tmp_path):
    result = subprocess.run(["bash", "run_and_time.sh", "--rank", "true"], cwd=ROOT, capture_output=True,
                            text=True, env={"PATH": fake_tools(tmp_path), "DGXNGPU": "100", "LOCAL_RANK": "1"})
    assert result.returncode == 0 and "without CPU binding (fewer cores than ranks)" in result.stderr

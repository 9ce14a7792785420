"""Which CPU cores and memory node each rank of a node runs on: those of its GPU.

    python -m rn50_mx.bind LOCAL_RANK RANKS [--visible CUDA_VISIBLE_DEVICES] [--sysfs /sys]
    -> "--physcpubind=0-7,64-71 --membind=0" (numactl options), or nothing when the node has fewer cores than ranks

A GPU's PCI bus id (`nvidia-smi --query-gpu=index,pci.bus_id`) names its sysfs device, whose `numa_node` and
`local_cpulist` say which cores are closest to it. On a DGX A100 (NPS4) GPUs 0 and 1 sit on NUMA node 3, so
binding rank r to the r-th slice of cores, as the NF5688M6 log shows, would put them a socket away. Ranks whose
GPUs share a node share its physical cores (with their hyperthread siblings) equally, in rank order. Where the
GPU's place is unknown (no nvidia-smi, as on a CPU machine; no sysfs entry; numa_node -1 and no local_cpulist),
the ranks take equal slices of all cores in rank order, which is the reference's bind.sh --cpu=exclusive.
"""
import os
import subprocess
from collections import namedtuple

from .config import Parser
from .errors import run_cli

Core = namedtuple("Core", "node cpus")


def read_cores(lscpu_text):
    """Physical cores in lscpu order, each with its NUMA node and logical CPUs (`lscpu -p=CPU,CORE,NODE`)."""
    cores = {}
    for line in lscpu_text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        cpu, core, node = (line.split(",") + [""])[:3]
        cores.setdefault(core, Core(int(node or 0), []))[1].append(int(cpu))
    return list(cores.values())


def cpu_list(text):
    """The CPUs of a sysfs/numactl list such as "0-15,64-79"."""
    cpus = []
    for part in filter(None, text.strip().split(",")):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def query_gpus(fields):
    """One row per GPU of `nvidia-smi --query-gpu=FIELDS`, each a list of stripped values; [] where there is no
    nvidia-smi or it fails (no driver)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[value.strip() for value in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_bus_ids():
    """{GPU index: PCI bus id}."""
    return {int(index): bus for index, bus in query_gpus("index,pci.bus_id")}


def gpu_cpus(bus_id, sysfs):
    """(NUMA node or None, the CPUs local to the GPU) from its sysfs device; (None, []) when sysfs says nothing.
    nvidia-smi writes an 8-digit PCI domain (00000000:07:00.0), sysfs a 4-digit one (0000:07:00.0)."""
    domain, _, rest = bus_id.lower().partition(":")
    device = os.path.join(sysfs, "bus", "pci", "devices", f"{domain[-4:]}:{rest}")
    try:
        with open(os.path.join(device, "numa_node")) as f:
            node = int(f.read())
        with open(os.path.join(device, "local_cpulist")) as f:
            local = cpu_list(f.read())
    except (OSError, ValueError):
        return None, []
    return (node if node >= 0 else None), local


def near_cores(cores, node, local):
    """The physical cores next to a GPU: those of its NUMA node, or else those whose CPUs are all local to it."""
    if node is not None:
        return [c for c in cores if c.node == node]
    return [c for c in cores if local and set(c.cpus) <= set(local)]


def cores_of_rank(rank, ranks, cores, places):
    """The cores of `rank`: an equal share of those near its GPU among the ranks whose GPUs are near the same
    ones; with no place for its GPU, an equal slice of all cores in rank order. [] when too few to share."""
    near = [near_cores(cores, *places[r]) if r in places else [] for r in range(ranks)]
    if near[rank]:
        sharing = [r for r in range(ranks) if near[r] == near[rank]]
        group = near[rank]
        share, i = len(group) // len(sharing), sharing.index(rank)
    else:
        group, share, i = cores, len(cores) // ranks, rank
    return group[i * share:(i + 1) * share]


def numactl_options(rank, ranks, cores, places):
    """numactl flags binding `rank` to its cores and their NUMA node's memory; "" when there are too few."""
    chosen = cores_of_rank(rank, ranks, cores, places)
    if not chosen:
        return ""
    cpus = ",".join(str(cpu) for core in chosen for cpu in sorted(core.cpus))
    return f"--physcpubind={cpus} --membind={chosen[0].node}"


def gpu_places(ranks, visible, sysfs):
    """{local rank: (NUMA node, local CPUs)} for the ranks whose GPU sysfs describes. Rank r uses the r-th
    visible GPU (CUDA_VISIBLE_DEVICES lists nvidia-smi's indexes when it is set)."""
    bus = gpu_bus_ids()
    indexes = [int(v) for v in visible.split(",") if v.strip().isdigit()] if visible else list(range(ranks))
    places = {}
    for rank, index in enumerate(indexes[:ranks]):
        node, local = gpu_cpus(bus[index], sysfs) if index in bus else (None, [])
        if node is not None or local:
            places[rank] = (node, local)
    return places


def parser():
    """The command line; an error is one line (config.Parser)."""
    parser = Parser(prog="rn50_mx.bind", description=__doc__.split("\n")[0])
    parser.add_argument("rank", type=int, help="this process's local rank")
    parser.add_argument("ranks", type=int, help="ranks on this node")
    parser.add_argument("--visible", default="", help="CUDA_VISIBLE_DEVICES, when it is set")
    parser.add_argument("--sysfs", default="/sys", help="where sysfs is mounted")
    return parser


def main(argv=None):
    args = parser().parse_args(argv)
    lscpu = subprocess.run(["lscpu", "-p=CPU,CORE,NODE"], capture_output=True, text=True).stdout
    print(numactl_options(args.rank, args.ranks, read_cores(lscpu), gpu_places(args.ranks, args.visible,
                                                                                args.sysfs)))
    return 0


if __name__ == "__main__":
    run_cli(main, "rn50_mx.bind")

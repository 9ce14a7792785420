"""Where candidates are measured. MXNet reads OMP_NUM_THREADS once, when it loads: MXSetNumOMPThreads changes the
calling thread only, and the engine's worker threads keep the count they started with (with OMP_NUM_THREADS=1, a
convolution after MXSetNumOMPThreads(2) still ran without an OpenMP team: no thread was added). So a candidate with
another OpenMP thread count is measured in a worker process started with it, driven over a pipe one timed window at
a time; the rounds of a comparison still alternate, so its contenders stay side by side."""
import collections
import json
import subprocess
import sys

from .. import children, config, dist, measure, train
from . import space

KEEP = 5  # pipelines a worker keeps built: the incumbent, the candidate, and the bench's final comparison
MARK = "RATE "


class Local:
    """Candidates measured in this process: one training step (the network built once, as train.py builds it), the
    candidates' pipelines built once each and kept while they are in use; measure.timed(s) stands for `s`."""

    def __init__(self, s, ctx):
        self.s, self.ctx = measure.timed(s), ctx
        self.seed = train.rank_seed(s, dist.Single())[1]
        self.step = measure.train_step(self.s, ctx)
        self.pipelines = collections.OrderedDict()

    def batches(self, knobs):
        """Endless batches of a candidate (knobs None: the synthetic ones), built on first use."""
        key = json.dumps(knobs, sort_keys=True)
        if key not in self.pipelines:
            s = self.s.replace(synthetic=True) if knobs is None else space.apply(self.s, knobs)
            self.pipelines[key] = measure.batches(s, self.ctx, self.seed)
            while len(self.pipelines) > KEEP:
                self.pipelines.popitem(last=False)
        self.pipelines.move_to_end(key)
        return self.pipelines[key]

    def rate(self, knobs, steps):
        """One timed window of a candidate; the untimed steps before it outnumber its prefetched batches."""
        drain = max(measure.DRAIN, (knobs or {}).get("dali_prefetch_queue", 0) + 1)
        return measure.rate(self.step, self.batches(knobs), self.s.batch_size, steps, drain)


class Remote:
    """A Local in a worker process started with OMP_NUM_THREADS=omp, on the same settings (passed as flags)."""

    def __init__(self, s, omp):
        command = [sys.executable, "-m", "rn50_mx.tune", "--worker", *config.as_flags(s)]
        self.omp = omp
        self.process = children.start(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      env=config.environ_with(OMP_NUM_THREADS=str(omp)))

    def rate(self, knobs, steps):
        self.process.stdin.write(json.dumps([knobs, steps]) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith(MARK):
                return measure.Rate(*json.loads(line[len(MARK):]))
        raise RuntimeError(f"the worker with OMP_NUM_THREADS={self.omp} stopped (exit {self.process.wait()})")

    def close(self):
        self.process.stdin.close()
        self.process.wait()
        children.forget(self.process)


def serve(s, ctx):
    """The worker's loop: a line [knobs, steps] in, a line MARK + Rate out, until stdin closes."""
    local = Local(s, ctx)
    for line in sys.stdin:
        knobs, steps = json.loads(line)
        print(MARK + json.dumps(local.rate(knobs, steps)), flush=True)
    return 0


class Workers:
    """Where each candidate is measured: this process for its own OpenMP thread count, a worker for each other one."""

    def __init__(self, s, ctx):
        self.s, self.own = s, space.start(s).get("omp_num_threads")
        self.local, self.remote = Local(s, ctx), {}

    def measurer(self, knobs):
        omp = (knobs or {}).get("omp_num_threads", self.own)
        if omp == self.own:
            return self.local
        if omp not in self.remote:
            self.remote[omp] = Remote(self.s, omp)
        return self.remote[omp]

    def timer(self, knobs, steps):
        """A function timing one window of the candidate (None: synthetic batches, here)."""
        measurer = self.measurer(knobs)
        return lambda: measurer.rate(knobs, steps)

    def close(self):
        for remote in self.remote.values():
            remote.close()

"""One rank of a resumed run's check of its checkpoint, alone, as `python -m tests.support.resume_check ARGS` under
horovodrun (ARGS: rn50_mx.train's flags): checkpoint.Checkpoints as train.run makes it, each DALI pipeline it builds
counted (data.pipeline.build_pipeline wrapped). Prints "rank R: built [(split, shard), ...]; resumes FOLDER"."""
import sys

from rn50_mx import checkpoint, config, dist
from rn50_mx.data import pipeline
from rn50_mx.errors import run_cli


def main():
    s = config.load(sys.argv[1:])
    d = dist.init(s)
    built, build = [], pipeline.build_pipeline

    def counted(s, rec, idx, train, shard, *args):
        built.append(("train" if train else "val", shard))
        return build(s, rec, idx, train, shard, *args)

    pipeline.build_pipeline = counted
    saver = checkpoint.Checkpoints(s, d)
    print(f"rank {d.rank}: built {built}; resumes {saver.resume}", flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main, "resume_check")

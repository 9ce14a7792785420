"""What the tuner prints and writes: the plan, the table of candidates, and the config fragment."""
import datetime

from ..files import write_atomically
from . import space

FRAGMENT_NOTE = """# Sourced after config/{system}.sh by run_with_docker.sh and run.sub (trials.sh's source_fragments), where a
# variable exported after the config keeps its value; by hand: source config/{system}.sh; source {name}
"""


def plan(s, knobs, space_, args):
    """The --dry-run listing: what would be timed, in which order, and when it stops."""
    lines = [f"rn50_mx.tune on {s.dgxsystem}: {s.device}, batch {s.batch_size}, {s.image_shape}, {s.dtype} "
             f"{s.input_layout}, train data {s.data_train or 'not given (the timed run needs DATADIR or --data-train)'}",
             f"1. the ceiling: synthetic batches; 2. the current settings ({space.describe(knobs)}) on real data, "
             f"side by side, {args.rounds} rounds of {args.steps} steps",
             "3. coordinate descent, each candidate in paired rounds against the incumbent, knobs in this order:"]
    for knob, values in space_:
        lines.append(f"   {space.env_name(knob):22} {', '.join(space.text(v) for v in values)}  "
                     f"(now {space.text(knobs[knob])})")
    antialias = "searched (--allow-augmentation-changes)" if args.allow_augmentation_changes else \
        f"kept at {int(s.dali_resize_antialias)} (it changes the augmentation; --allow-augmentation-changes to search it)"
    lines += [f"   DALI_RESIZE_ANTIALIAS  {antialias}",
              f"stops at real/synthetic >= {args.target} or after {args.budget:g} min; at most "
              f"{sum(len(v) for _, v in space_)} candidates (the full grid has {len(space.grid(s, args.allow_augmentation_changes))})"]
    return "\n".join(lines)


def row_line(row):
    """One candidate: its variables, images/s, real/synthetic, data wait, CPU per image, verdict."""
    r = row.rate
    return (f"{space.describe(row.knobs):70} {r.images_per_s:8.1f} {row.ratio:6.3f} {r.wait_share:5.0%} "
            f"{1000 / r.images_per_cpu_s:7.2f}  {row.verdict} ({row.seconds:.0f} s)")


def table(rows, ceiling):
    head = f"{'candidate':70} {'img/s':>8} {'real/syn':>6} {'wait':>5} {'CPU ms/img':>7}  verdict"
    return "\n".join([f"ceiling (synthetic): {ceiling.images_per_s:.1f} img/s, "
                      f"{1000 / ceiling.images_per_cpu_s:.2f} CPU ms/img", head]
                     + [row_line(row) for row in rows])


def fragment(s, start, choice, ratios, stop):
    """The text of config/<SYSTEM>_tuned.sh: the chosen knobs as exports, with how they were found."""
    name = f"config/{s.dgxsystem}_tuned.sh"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = ["# shellcheck shell=bash",
            f"# Written by python -m rn50_mx.tune, {when}, for config/{s.dgxsystem}.sh (batch {s.batch_size}, "
            f"{s.image_shape}, {s.device}) on {s.data_train}",
            f"# real/synthetic {ratios[0]:.3f} with {space.describe(start)}",
            f"# real/synthetic {ratios[1]:.3f} with these ({stop})",
            *FRAGMENT_NOTE.format(system=s.dgxsystem, name=name).splitlines()]
    return "\n".join(head + [f"export {k}={v}" for k, v in space.exports(choice)]) + "\n"


def write_fragment(path, text):
    """Write `text` to `path` under a temporary name, then rename: a reader never sees half a file."""
    write_atomically(path, text)

"""The five official Inspur NF5688M6 v1.0 result logs (tests/data/inspur_nf5688m6), edited copies of them, and the
report rn50_mx.timing builds of logs."""
import shutil
from pathlib import Path

from rn50_mx import timing

FIXTURE = Path(__file__).parents[1] / "data" / "inspur_nf5688m6"


def report_of(paths, with_rcp=False, ruleset="1.0.0"):
    """The report `main` prints, built from the library functions."""
    runs = [timing.read_run(path, ruleset) for path in timing.find_logs([str(p) for p in paths])]
    for run in runs:
        run.compliance, run.compliance_reason = timing.check_compliance(run.path, ruleset)
    return timing.build_report(runs, ruleset, with_rcp)


def edited_fixture(tmp_path, edits):
    """The five fixture logs copied to tmp_path, with {file name: (old text, new text)} substituted."""
    folder = tmp_path / "logs"
    shutil.copytree(FIXTURE, folder, ignore=shutil.ignore_patterns("README.md"))
    for name, (old, new) in edits.items():
        text = (folder / name).read_text(encoding="latin-1")
        assert old in text, f"{old!r} not in {name}"
        (folder / name).write_text(text.replace(old, new), encoding="latin-1")
    return folder

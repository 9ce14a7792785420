"""The closed-division rules, checked by the compliance checker; and the rules' momentum, which no checker tests."""
import logging
import os
import tempfile

from mlperf_logging import mllog
from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

from .. import mlperf_log
from ..mlperf_rules import BENCHMARK, USAGE

MOMENTUM_RULE_BATCH = 32768  # training_rules: LARS momentum is 0.9 below a 32k batch (no checker tests it)


def closed_rule_failures(settings, ruleset):
    """The compliance checker's closed-division verdict on the optimizer keys training would log for `settings`:
    one line per failed rule (closed_resnet.yaml and the optimizer file it enqueues)."""
    events = mlperf_log.hyperparameter_events(settings)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "hyperparameters.log")
        write_log(path, events)
        lines, _ = mlp_parser.parse_file(path, ruleset=ruleset)
    checker = mlp_compliance.make_checker(USAGE, ruleset, quiet=True, werror=False)
    checker.check_loglines(lines, f"{USAGE}_{ruleset}/closed_{BENCHMARK}.yaml")
    logged = dict(events)
    return [f"{key}={logged[key]}: " + " ".join(" ".join(line.split()) for line in message.splitlines()
                                                 if line.startswith("failed test:") or "EXACTLY_ONE" in line)
            for key, message in checker.overwritable.items() if key in logged]


def write_log(path, events):
    """MLLOG lines of (key, value) events in a file, written by mllog itself (its own logger, not training's)."""
    logger = logging.getLogger("rn50_mx.recipe.closed_rules")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.FileHandler(path)
    logger.addHandler(handler)
    try:
        writer = mllog.mllog.MLLogger(logger=logger, default_namespace="")
        for key, value in events:
            writer.event(key, value)
    finally:
        logger.removeHandler(handler)
        handler.close()


def momentum_note(batch, momentum):
    """The rules' LARS momentum (0.9 below a 32k batch), which no checker tests."""
    if batch < MOMENTUM_RULE_BATCH and momentum != 0.9:
        return (f"momentum {momentum} breaks the rules' 0.9 below a {MOMENTUM_RULE_BATCH} batch (training_rules' "
                "hyperparameter table; the compliance checker does not test it)")
    return ""

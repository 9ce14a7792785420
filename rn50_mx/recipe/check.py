"""Where settings stand against the RCP table, and the closed-division rules' verdict (for `python -m rn50_mx.check`
and the recipe)."""
import math

from .choosing import whole_epochs
from ..mlperf_rules import (DEFAULT_RULESET, IMAGENET_CLASSES, PUBLISHED, checker_reference, load_checker,
                            rcp_points)
from .rules import closed_rule_failures, momentum_note


def verdict(s, ruleset=DEFAULT_RULESET):
    """One line for `python -m rn50_mx.check`: whether the settings' global batch and hyperparameters are an RCP of the
    ruleset (which), interpolated between RCPs, or off the table; and closed-rule failures."""
    batch = s.global_batch
    if s.num_classes != IMAGENET_CLASSES or not s.is_lars:
        what = f"{s.num_classes} classes" if s.num_classes != IMAGENET_CLASSES else f"optimizer {s.optimizer}"
        return (f"RCP ({ruleset}): off the table: the ResNet RCPs are LARS runs on ImageNet's {IMAGENET_CLASSES} "
                f"classes; these settings train {what}")
    checker = load_checker(ruleset)
    text = f"RCP ({ruleset}): global batch {batch}: " + place(s, batch, checker)
    failures = closed_rule_failures(s, ruleset)
    if failures:
        text += f"; the closed-division checker would reject it: {failures[0]}"
    note = momentum_note(batch, s.mom)
    return text + (f"; {note}" if note else "")


def place(s, batch, checker):
    """Where the global batch and hyperparameters stand against the RCP table (and the published runs)."""
    point = next((p for p in rcp_points(checker) + list(PUBLISHED) if p.batch == batch), None)
    if point:
        mine = (s.lr, s.warmup_epochs, s.num_epochs, s.mom, s.wd)
        theirs = (point.lr, point.warmup_epochs, whole_epochs(point.horizon), point.momentum, point.wd)
        kind = "matches the RCP" if point.name.startswith("resnet_ref") else "not an RCP; matches the published run"
        record, how_kind, how = checker_reference(checker, batch)
        pruned = f" (the RCP checker prunes it and uses {how})" if how_kind != "rcp" else ""
        if mine == theirs:
            return f"{kind} {point.name}{pruned}"
        names = ("LR", "WARMUP_EPOCHS", "NUMEPOCHS", "MOM", "WD")
        differ = ", ".join(f"{n} {a} (its {b})" for n, a, b in zip(names, mine, theirs) if a != b)
        return f"the batch of {point.name}, but not its hyperparameters: {differ}; not validated"
    record, kind, how = checker_reference(checker, batch)
    if kind == "interpolated":
        return f"interpolated: the checker uses {how} (mean {record['RCP Mean']:.2f} epochs); not validated by an RCP"
    return f"off the table: the checker uses {how}"


def search_room(recipe):
    """What a search could save at the recipe's batch: the epochs to expect against the fewest whose olympic mean the
    RCP checker accepts ('' when it accepts none fewer). Above a 4k batch the published sets sat 1-12% above the
    checker's mean (issue 34); rn50_mx.search's default horizon range reaches down to this floor."""
    record, _, _ = checker_reference(load_checker(recipe.ruleset), recipe.global_batch)
    if record is None or recipe.expect[0] <= record["Min Epochs"]:
        return ""
    room = recipe.expect[0] - record["Min Epochs"]
    return (f"search: the RCP checker accepts an olympic mean down to {record['Min Epochs']:.2f} epochs, {room:.1f} "
            f"({room / recipe.expect[0]:.0%} of the epochs and minutes) below the {recipe.expect[0]:g} to expect; "
            f"`python -m rn50_mx.search`'s default horizon range reaches down to {math.ceil(record['Min Epochs'])}")

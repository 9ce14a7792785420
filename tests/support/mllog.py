"""Reading the MLPerf lines of a log, and what the compliance checker says of a short run's."""
import json

# What the compliance checker says of a short run's log whose structure is right: only the target is missing.
CHECKER_ON_A_SHORT_RUN = ("FAILED", "Failed checks for eval_accuracy : v['value'] >= 0.7590 and v['value'] < 1.0")


def events(path):
    """The MLLOG lines of a log, in order, as (key, value, metadata)."""
    with open(path) as f:
        lines = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in f if ":::MLLOG " in line]
    return [(e["key"], e["value"], e["metadata"]) for e in lines]


def values(log, key, field=None):
    """The value (or a metadata field) of each `key` line."""
    return [meta[field] if field else value for k, value, meta in log if k == key]


def mllog(path, key):
    """The values of `key` in the lines of a log that start with the MLPerf prefix."""
    with open(path) as f:
        lines = [json.loads(line[len(":::MLLOG "):]) for line in f if line.startswith(":::MLLOG ")]
    return [event["value"] for event in lines if event["key"] == key]

"""python -m rn50_mx.op_cache: keep this MXNet's operator code for every later import (make runs it after installing
MXNet)."""
import marshal
import sys

from ..errors import run_cli
from ..files import write_atomically
from . import HEADER, PATH, parser, recorded


def main():
    parser().parse_args()
    if "mxnet" in sys.modules:
        raise SystemExit("rn50_mx.op_cache: MXNet is already loaded in this process: its sources cannot be recorded")
    table = recorded()
    write_atomically(PATH, HEADER + marshal.dumps(table), "operator code")
    print(f"{PATH}: {len(table)} operator functions compiled")


run_cli(main, "rn50_mx.op_cache")

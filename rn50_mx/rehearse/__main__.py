from . import main
from ..errors import run_cli

run_cli(main, "rn50_mx.rehearse")

"""One error type for bad input, and the CLI wrapper that turns it into one line on stderr."""
import sys


class InputError(Exception):
    """Bad input from the user: the message names the file (or setting) and the problem, on one line."""


def run_cli(main, prog):
    """Run `main()`; an InputError or Ctrl-C ends the process with one line and a non-zero code."""
    try:
        code = main()
    except InputError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)

"""``python -m hypertf.cli``: the ``hypertf`` command with a chosen interpreter (agents, tests)."""

import sys

try:
    from hypertf.cli.warm import main
except KeyboardInterrupt:  # Ctrl-C in the first milliseconds: nothing has started yet
    print("hypertf: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())

"""``python -m hypertf.cli``: the ``hypertf`` command with a chosen interpreter (agents, tests)."""

import sys

from hypertf.core.errors import say_interrupted

try:
    from hypertf.cli.warm import main
except KeyboardInterrupt:  # Ctrl-C in the first milliseconds: nothing has started yet
    sys.exit(say_interrupted())

sys.exit(main())

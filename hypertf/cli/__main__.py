"""``python -m hypertf.cli``: the ``hypertf`` command with a chosen interpreter (agents, tests)."""

import sys

from hypertf.cli.warm import main

sys.exit(main())

"""``python -m hypertf.cli``: the ``hypertf`` command with a chosen interpreter (agents, tests)."""

import sys

from hypertf.cli.main import main

sys.exit(main())

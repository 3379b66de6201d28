"""Loaded by Python at start when the launcher puts this folder on PYTHONPATH: installs the
offload hook if HYPERTF_OFFLOAD_CHANNEL is set, and never stops the program starting."""

from __future__ import annotations

import sys

try:
    from hypertf.offload import hook

    hook.install()
except Exception as exc:
    print(f"hypertf offload: hook not installed ({exc}); products stay local",
          file=sys.stderr)

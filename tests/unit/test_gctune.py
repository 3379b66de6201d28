"""The garbage collector's thresholds in HyperTF's processes (hypertf.core.gctune; its
effect is measured by bench/scale.py at 10,000 hosts)."""

from __future__ import annotations

import subprocess
import sys

from hypertf.core import gctune


def test_a_command_runs_with_the_collectors_thresholds_set():
    code = ("import gc\nfrom hypertf.cli.main import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('thresholds', gc.get_threshold())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert f"thresholds {gctune.THRESHOLDS}" in out

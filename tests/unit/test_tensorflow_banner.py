"""A sweep's board records a trial (TensorBoard's HParams) without importing TensorFlow, so
no TensorFlow C++ start-up banner reaches the sweep's output."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BANNERS = ("oneDNN", "cpu_feature_guard", "TF_ENABLE_ONEDNN_OPTS", "absl::InitializeLog")


def test_recording_a_trial_prints_no_tensorflow_banner(tmp_path: Path) -> None:
    """record_trial once imported TensorFlow (TensorBoard's HParams API and event writer do),
    and its C++ start-up banners reached the sweep's stderr. It now imports no TensorFlow at
    all (sweep/board.py): in a fresh Python, as the sweep driver is, nothing is printed and
    no TensorFlow is loaded."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("tensorflow")
    code = textwrap.dedent(f"""\
        from pathlib import Path
        from hypertf.sweep import board
        trials = [{{"index": 0, "params": {{"lr": 0.1}}, "metric": 0.5, "label": "lr=0.1"}}]
        run = board.record_trial(Path({str(tmp_path)!r}), "score", trials, trials[0])
        import sys
        assert "tensorflow" not in sys.modules and "keras" not in sys.modules
        print(run)
        """)
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("trial-0"), done.stdout
    banners = [line for line in done.stderr.splitlines() if any(b in line for b in BANNERS)]
    assert not banners, done.stderr

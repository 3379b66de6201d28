"""A sweep as users run it: its output carries no TensorFlow C++ start-up banner (the driver
imports TensorFlow for TensorBoard's HParams), and ``sweep list`` shows the sweeps of its
inventory, not another cluster's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hypertf.launch.request import TrainRequest
from hypertf.sweep import driver as sweeps
from hypertf.sweep.spec import SweepSpec, expand, parse_grid_option
from tests.launcher.helpers import FAKE, all_free, hypertf

BANNERS = ("oneDNN", "cpu_feature_guard", "TF_ENABLE_ONEDNN_OPTS", "absl::InitializeLog")


def test_a_sweep_prints_no_tensorflow_banner_and_lists_only_its_inventory(
        lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("tensorboard")  # no HParams written, no TensorFlow imported
    done = hypertf("sweep", "-i", lab.inventory, "--script", FAKE, "--worker", "1",
                   "--grid", "lr=0.1", "--metric", "score", "--", "--work_s", "0.2",
                   "--write_metrics", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"sweep (sweep-\S+):", done.stdout)
    assert found, done.stdout
    ours = found.group(1)
    assert list((tmp_path / "runs" / "sweeps" / ours / "tensorboard").glob("trial-0/*"))
    banners = [line for line in done.stderr.splitlines() if any(b in line for b in BANNERS)]
    assert not banners, done.stderr

    monkeypatch.chdir(tmp_path)  # another cluster's sweep, beside it
    other = tmp_path / "other.yml"
    other.write_text("")
    trials = expand(SweepSpec(script="t.py", train={}, grid=parse_grid_option(["lr=0.1"])))
    theirs = sweeps.create(str(other), TrainRequest(script="t.py"), trials, None, "max", 2,
                           None).sweep_id
    listing = hypertf("sweep", "list", "-i", lab.inventory, cwd=tmp_path)
    assert ours in listing.stdout and theirs not in listing.stdout, listing.stdout
    listing = hypertf("sweep", "list", "-i", "other.yml", cwd=tmp_path)
    assert theirs in listing.stdout and ours not in listing.stdout, listing.stdout
    assert all_free(lab.inventory)

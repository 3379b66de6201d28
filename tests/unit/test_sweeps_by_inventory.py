"""A sweep belongs to its inventory: ``sweep list`` and the dashboard (its ``/api/sweeps``
too) show only the sweeps of theirs. Sweeps made as ``hypertf sweep`` makes them; no
ZooKeeper (both read only local files)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from hypertf.config.inventory import Inventory
from hypertf.core.layout import Layout
from hypertf.dashboard.server import Dashboard
from hypertf.dashboard.source import ClusterSource, sweep_rows
from hypertf.launch.request import TrainRequest
from hypertf.store.session import Store
from hypertf.sweep import driver as sweeps
from hypertf.sweep.spec import SweepSpec, expand, parse_grid_option

REPO = Path(__file__).resolve().parents[2]


def hypertf(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hypertf.cli", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=60)




@pytest.fixture
def two_sweeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A sweep of each of two inventories, made as ``hypertf sweep`` makes them."""
    monkeypatch.chdir(tmp_path)
    trials = expand(SweepSpec(script="t.py", train={}, grid=parse_grid_option(["lr=0.1"])))
    ids = []
    for inventory in ("a.yml", "b.yml"):
        (tmp_path / inventory).write_text("")
        ids.append(sweeps.create(inventory, TrainRequest(script="t.py"), trials, None, "max", 2,
                                 None).sweep_id)
    return ids[0], ids[1]


def test_sweep_list_and_the_dashboard_show_the_sweeps_of_their_inventory(
        two_sweeps: tuple[str, str], tmp_path: Path) -> None:
    of_a, of_b = two_sweeps
    listing = hypertf("sweep", "list", "-i", "a.yml", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert of_a in listing.stdout and of_b not in listing.stdout, listing.stdout
    assert "1 sweeps of other inventories not shown" in listing.stdout
    listing = hypertf("sweep", "list", "-i", str(tmp_path / "b.yml"), cwd=tmp_path)
    assert of_b in listing.stdout and of_a not in listing.stdout, listing.stdout
    every = hypertf("sweep", "list", cwd=tmp_path)  # without -i: each names its inventory
    assert f"{of_a}  idle" in every.stdout and "(on a.yml)" in every.stdout, every.stdout
    assert "(on b.yml)" in every.stdout, every.stdout
    assert [row["sweep"] for row in sweep_rows(tmp_path / "a.yml")] == [of_a]


def test_the_dashboards_api_serves_only_its_inventorys_sweeps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inventory: Inventory) -> None:
    monkeypatch.chdir(tmp_path)
    trials = expand(SweepSpec(script="t.py", train={}, grid=parse_grid_option(["lr=0.1"])))
    other = tmp_path / "other.yml"
    other.write_text("")
    ours = sweeps.create(str(inventory.path), TrainRequest(script="t.py"), trials, None, "max",
                         1, None).sweep_id
    theirs = sweeps.create(str(other), TrainRequest(script="t.py"), trials, None, "max", 1,
                           None).sweep_id
    # /api/sweeps reads local files only: a client never started (no ZooKeeper asked)
    store = Store(KazooClient(hosts="127.0.0.1:1"), Layout("/hypertf"))
    with Dashboard(ClusterSource(inventory, store, viewer=""), port=0) as server:
        server.start()
        try:
            with urllib.request.urlopen(server.url + "api/sweeps", timeout=10) as answer:
                rows = json.load(answer)
        finally:
            server.shutdown()
    assert [row["sweep"] for row in rows] == [ours], (rows, theirs)
    assert Path(rows[0]["inventory"]).resolve() == Path(inventory.path).resolve()

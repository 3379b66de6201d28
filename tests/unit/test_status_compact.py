"""hypertf status beyond 64 hosts: one plain line per host, GPUs grouped by state (its
speed is measured by bench/scale.py)."""

from __future__ import annotations

import io

from rich.console import Console

from hypertf.cli import statustable
from hypertf.store import status

KEY = "20261122-150000-abcdef.alice"


def report(hosts: int) -> dict:
    rows = []
    for i in range(hosts):
        gpus = [{"index": g, "state": "busy" if g % 2 else "free",
                 "task_key": KEY if g % 2 else None} for g in range(8)]
        rows.append({"name": f"node{i:05d}", "agent": "up", "heartbeat_age_s": 1.0,
                     "data_addr": f"10.0.{i // 256}.{i % 256}", "address": "x", "gpus": gpus,
                     "gpu_driver": {"driver": "550.54"}, "gpu_source": "nvml"})
    rows[1]["agent"] = "down"
    rows[1]["gpus"] = [{"index": 0, "state": "unavailable", "reason": "agent down"}]
    return {"inventory": "inv.yml", "hosts": rows, "jobs": [KEY],
            "zookeeper": {"root": "/hypertf", "servers": [
                {"server": "127.0.0.1:2181", "mode": "standalone", "latency_ms": 1.0}]}}


def rendered(hosts: int) -> str:
    out = io.StringIO()
    statustable.render(report(hosts), Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_a_large_cluster_gets_one_line_per_host_with_gpus_grouped():
    text = rendered(1000)
    lines = text.splitlines()
    assert lines[0].startswith("HyperTF cluster (inv.yml): 1000 hosts (999 agents up), 3996 of")
    assert "550.54 (999 hosts)" in lines[1]
    assert lines[3].split() == ["node00000", "up,", "seen", "1s", "ago", "10.0.0.0", "free",
                                "0,2,4,6;", "busy", KEY, "1,3,5,7"]
    assert "down" in lines[4] and "unavailable (agent down) 0" in lines[4]
    assert f"Jobs holding resources: {KEY}" in text


def test_a_small_cluster_keeps_the_table():
    assert "GPU 7" in rendered(3)  # a column per GPU: the rich table


def test_equal_plain_rows_are_shared_and_say_what_the_detailed_entries_say():
    """The compact view builds a row of plain GPUs once per distinct row (10,000 hosts
    have a few): the same list again, with the detailed view's index, state and job."""
    row = [1, KEY, f"draining:{KEY}", 0]
    plain_gpus = {index: {"index": index, "name": "GPU", "utilization": 0.0} for index in range(4)}
    compact = status._GpuEntries(gpu_details=False)
    first = compact.row(row, plain_gpus)
    assert compact.row(list(row), {}) is first  # a host without details: the same row
    detailed = status._GpuEntries(gpu_details=True).row(row, plain_gpus)
    assert [{k: e[k] for k in ("index", "state", "task_key")} for e in detailed] == first
    assert [e["state"] for e in first] == ["free", "busy", "draining", "unavailable"]
    # a GPU with something to say keeps its own entry, and its row is not shared
    said = compact.row(row, {**plain_gpus, 3: {"index": 3, "reason": "ECC errors"}})
    assert said is not first and said[3]["reason"] == "ECC errors" and said[0] is first[0]

"""``hypertf status``'s rendering: how long ago each host's agent was last seen."""

from __future__ import annotations

import io

from rich.console import Console

from hypertf.cli import statustable


def test_status_says_when_the_agent_was_last_seen() -> None:
    report = {"inventory": "inv.yml", "jobs": [], "zookeeper": {"root": "/r", "servers": []},
              "hosts": [{"name": "h1", "agent": "up", "heartbeat_age_s": 13.0,
                         "data_addr": "10.0.0.1", "address": "x", "gpu_source": "nvml",
                         "gpu_driver": {"driver": "550"},
                         "gpus": [{"index": 0, "state": "free"}]}]}
    out = io.StringIO()
    statustable.render(report, Console(file=out, width=200, color_system=None))
    assert "up, seen 13s ago" in out.getvalue(), out.getvalue()

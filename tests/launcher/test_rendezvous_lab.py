"""torchrun's variables on the lab (hypertf.core.rendezvous): ranks unique and complete,
MASTER_ADDR:MASTER_PORT reached by every rank, LOCAL_RANK and NODE_RANK right with two
tasks on one host and one on another; JAX's and Keras 3's coordinator is the same address."""

from __future__ import annotations

import json
from pathlib import Path

from tests.launcher.helpers import REPO, hypertf

SCRIPT = str(REPO / "tests" / "scripts" / "torch_rendezvous.py")


def test_every_rank_meets_the_master_with_its_local_and_node_rank(lab, tmp_path: Path):
    run = hypertf("train", "-i", lab.inventory, "--script", SCRIPT, "--worker", "3",
                  "--policy", "pack", "--gpus-per-worker", "2", cwd=tmp_path)
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    worlds = [line.split("world=", 1)[1] for line in run.stdout.splitlines() if "world=" in line]
    assert len(worlds) == 1, said
    world = json.loads(worlds[0])
    assert [p["RANK"] for p in world] == ["0", "1", "2"]  # unique and complete
    assert {p["WORLD_SIZE"] for p in world} == {"3"}
    assert [p["task"] for p in world] == ["worker:0", "worker:1", "worker:2"]
    assert said.count(": ok") == 2, said  # every other rank heard back from the master
    hosts: dict[str, list[dict[str, str]]] = {}
    for p in world:
        hosts.setdefault(p["host"], []).append(p)
    assert sorted(len(v) for v in hosts.values()) == [1, 2], world  # 2 tasks + 1 task
    for members in hosts.values():
        assert [m["LOCAL_RANK"] for m in members] == [str(i) for i in range(len(members))]
        assert {m["LOCAL_WORLD_SIZE"] for m in members} == {str(len(members))}
        assert len({m["NODE_RANK"] for m in members}) == 1
    assert world[0]["NODE_RANK"] == "0" and {p["NODE_RANK"] for p in world} == {"0", "1"}
    coordinator = f"{world[0]['MASTER_ADDR']}:{world[0]['MASTER_PORT']}"
    assert {p["JAX_COORDINATOR_ADDRESS"] for p in world} == {coordinator}
    assert [p["KERAS_DISTRIBUTION_PROCESS_ID"] for p in world] == ["0", "1", "2"]

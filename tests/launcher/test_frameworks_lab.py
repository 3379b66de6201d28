"""Keras 3 on JAX and JAX itself on the lab (docs/frameworks.md): two processes on two hosts
find each other from HyperTF's variables alone, train or reduce together, and leave
nothing running."""

from __future__ import annotations

import re
from pathlib import Path

from tests.launcher.helpers import REPO, all_free, hypertf, processes_of


def test_keras3_on_jax_trains_data_parallel_over_two_hosts(lab, tmp_path: Path):
    run = hypertf("train", "-i", lab.inventory, "--script",
                  str(REPO / "examples" / "keras3_jax.py"), "--worker", "2", "--",
                  "--epochs", "6", cwd=tmp_path)
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    assert said.count("of 2: 2 devices") == 2, said  # each process sees both processes
    losses = [[float(v) for v in line.split("losses ", 1)[1].split()]
              for line in said.splitlines() if "losses " in line]
    assert len(losses) == 2, said
    for mine, other in zip(*losses, strict=True):  # one model: each epoch's losses close
        assert abs(mine - other) < 0.05 * max(mine, other), losses
    assert losses[0][-1] < losses[0][0] / 2, losses  # the loss falls
    accuracy = float(re.findall(r"test_accuracy=([0-9.]+)", said)[-1])
    assert accuracy > 0.8, said
    assert all_free(lab.inventory) and not any(processes_of(lab.inventory).values())


def test_jax_processes_reduce_across_hosts(lab, tmp_path: Path):
    run = hypertf("train", "-i", lab.inventory, "--script",
                  str(REPO / "examples" / "jax_distributed.py"), "--worker", "2",
                  cwd=tmp_path)
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    assert said.count("sum=3") == 2, said  # 1 + 2, seen by both processes
    # judged by its coordinator alone: worker:1 opens no port of its own
    assert "rendezvous: coordinator (only rank 0's port" in said, said
    assert all_free(lab.inventory) and not any(processes_of(lab.inventory).values())

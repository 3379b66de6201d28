"""Preemption that resumes, end to end on a lab of 2 hosts x 1 GPU with real TensorFlow
(issue 52): bob's priority-0 job (examples/checkpointed.py, 2 workers) holds every GPU;
alice's priority-5 job is submitted with preemption on (minimum runtime 0, grace 20 s).
Alice's tasks start within the grace + 5 s, bob's job is requeued, resumes from its
checkpoint (its step count goes on) and ends succeeded with 2 attempts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hypertf.config import environment
from hypertf.ops import lab as lab_module
from tests.launcher.helpers import EXAMPLES, FAKE, all_free, strict_env, until_line

GRACE_S = 20


@pytest.fixture
def preempt_lab(state_home: Path):
    """Its own lab: the keeper reads hypertf_preempt at its agent's start."""
    lab = lab_module.up(hosts=2, gpus=1, base=state_home / "labs", settings={
        "hypertf_preempt": True, "hypertf_preempt_grace_s": GRACE_S,
        "hypertf_preempt_min_runtime_s": 0})
    try:
        for user in ("alice", "bob"):
            subprocess.run([sys.executable, "-m", "hypertf.cli", "auth", "add-user", user,
                            "-i", lab.inventory], check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "hypertf.cli", "auth", "limits", "alice",
                        "--max-priority", "5", "-i", lab.inventory], check=True,
                       capture_output=True,
                       env={**os.environ, environment.ZK_IDENTITY.name: "admin"})
        yield lab
    finally:
        lab_module.down(lab)


def as_user(user: str) -> dict[str, str]:
    return {**strict_env(), environment.ZK_IDENTITY.name: f"user.{user}",
            "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.tf
def test_a_preempted_job_resumes_from_its_checkpoint_and_succeeds(preempt_lab, tmp_path):
    lab = preempt_lab
    bob_dir, alice_dir = tmp_path / "bob", tmp_path / "alice"
    bob_dir.mkdir()
    alice_dir.mkdir()
    bob = subprocess.Popen(
        [sys.executable, "-m", "hypertf.cli", "train", "-i", lab.inventory, "--script",
         str(EXAMPLES / "checkpointed.py"), "--worker", "2", "--priority", "0",
         "--checkpoint-dir", str(tmp_path / "checkpoints"), "--",
         "--steps", "400", "--step_delay", "0.05", "--save_every", "1000"],
        cwd=bob_dir, env=as_user("bob"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        seen = until_line(bob, "step 20")
        assert re.search(r"step 20\b", "".join(seen)), "".join(seen)[-2000:]
        submitted = time.monotonic()
        alice = subprocess.Popen(
            [sys.executable, "-m", "hypertf.cli", "train", "-i", lab.inventory, "--script",
             FAKE, "--worker", "2", "--priority", "5", "--", "--work_s", "1"],
            cwd=alice_dir, env=as_user("alice"), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        said = until_line(alice, ": started ")
        took = time.monotonic() - submitted
        rest, _ = alice.communicate(timeout=120)
        assert alice.returncode == 0, "".join(said) + rest
        assert took <= GRACE_S + 5, f"alice's tasks started {took:.1f} s after her submit"
        out, _ = bob.communicate(timeout=300)
        output = "".join(seen) + out
    finally:
        if bob.poll() is None:
            bob.kill()
            bob.communicate()
    assert bob.returncode == 0, output[-4000:]
    assert "preempted by" in output and "requeued as attempt 2" in output, output[-4000:]
    resumed = [int(n) for n in re.findall(r"attempt 2: resumed from step (\d+)", output)]
    assert resumed and min(resumed) >= 20, output[-4000:]  # it went on, not from 0
    assert all_free(lab.inventory)

"""examples/checkpointed.py alone, as a preempted task sees it: SIGTERM, then the preemption
notice file, each time a checkpoint and exit 143; the next start resumes, its step count
going on from the checkpoint instead of starting again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launcher.helpers import EXAMPLES


def start(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    environ.update(TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0",
                   HYPERTF_CHECKPOINT_DIR=str(tmp_path / "ckpt"), **env)
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / "checkpointed.py"), "--steps", "1000",
         "--step_delay", "0.01"], env=environ, cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def lines_until(job: subprocess.Popen[str], pattern: str) -> list[str]:
    """The output up to the first line matching ``pattern`` (the job ending first fails)."""
    lines = []
    assert job.stdout is not None
    for line in job.stdout:
        lines.append(line)
        if re.fullmatch(pattern, line.strip()):
            return lines
    raise AssertionError(f"ended before {pattern!r}:\n{''.join(lines)[-3000:]}")


def finish(job: subprocess.Popen[str], lines: list[str]) -> str:
    out, _ = job.communicate(timeout=60)
    return "".join(lines) + out


@pytest.mark.tf
def test_sigterm_or_the_notice_saves_and_the_next_start_resumes(tmp_path: Path) -> None:
    first = start(tmp_path, HYPERTF_ATTEMPT="1")
    lines = lines_until(first, r"step 20")
    first.send_signal(signal.SIGTERM)
    out = finish(first, lines)
    assert first.returncode == 143, out[-3000:]
    stopped = int(re.search(r"stopped at step (\d+) \(SIGTERM\): checkpoint saved", out)[1])
    assert stopped >= 20 and (tmp_path / "ckpt" / f"ckpt-{stopped}.index").is_file(), out

    notice = tmp_path / "preempt"
    second = start(tmp_path, HYPERTF_ATTEMPT="2", HYPERTF_PREEMPT_FILE=str(notice))
    lines = lines_until(second, rf"step {stopped + 10}")
    notice.write_text("HYPERTF_PREEMPT_DEADLINE=4102444800\n")
    out = finish(second, lines)
    assert second.returncode == 143, out[-3000:]
    assert f"attempt 2: resumed from step {stopped} " in out
    steps = [int(n) for n in re.findall(r"^step (\d+)$", out, re.MULTILINE)]
    assert steps[0] == stopped + 1 and steps == list(range(stopped + 1, steps[-1] + 1))
    again = int(re.search(r"stopped at step (\d+) \(preemption notice \(SIGKILL in \d+ s\)\)",
                          out)[1])
    assert again == steps[-1] and (tmp_path / "ckpt" / f"ckpt-{again}.index").is_file()

"""An unmodified TensorFlow program (tests/offload/program.py) with the hook loaded at
interpreter start: its products go to the agent and equal numpy's; an offload process
SIGKILLed mid-run leaves the program on local products, with the same results, one warning,
and nothing running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hypertf.offload.world import world
from tests.offload.conftest import shm_names

PROGRAM = Path(__file__).with_name("program.py")
NOISE = ("cpu_feature_guard", "To enable the following", "absl::InitializeLog", "oneDNN")


def check_results(out: Path) -> None:
    r = {p.stem: np.load(p) for p in out.glob("*.npy")}
    a, b = r["a"].astype(np.float64), r["b"].astype(np.float64)
    tol = {"rtol": 1e-5, "atol": 1e-4}
    for name in ("eager", "linalg", "graph", "graph_dynamic"):
        np.testing.assert_allclose(r[name], a @ b, **tol, err_msg=name)
    np.testing.assert_allclose(r["small"], a[:4, :4] @ b[:4, :4], **tol)
    np.testing.assert_allclose(r["batch"], np.stack([a @ b, 2 * a @ b]), **tol)
    x, kernel = r["x"].astype(np.float64), r["kernel"].astype(np.float64)
    np.testing.assert_allclose(r["dense"], x @ kernel, **tol)
    np.testing.assert_allclose(r["dense_grad"], x.T @ (2 * x @ kernel), rtol=1e-4, atol=1e-3)


def start(env_extra: dict[str, str], out: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, **env_extra, "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(PROGRAM), str(out), *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 90) -> str:
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in output.splitlines() if not any(n in line for n in NOISE)]
    assert proc.returncode == 0, "\n".join(lines[-30:])
    return "\n".join(lines)


def test_an_unmodified_program_is_offloaded_and_equal_to_numpy(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with world(2, tmp_path) as w:
        output = finish(start(w.task_env(1000, tmp_path / "stats.json"), out))
        agent_alive = w.proc.poll() is None
    stats = json.loads((tmp_path / "stats.json").read_text())
    check_results(out)
    assert agent_alive, "the agent stopped before the program ended"
    # eager, linalg, graph, graph_dynamic, batch, Dense forward, its gradient's 2 products
    assert stats["ops"] == 8 and stats["fallbacks"] == 0, (stats, output)
    assert stats["local"] == 1  # the 4 x 4 product: under the threshold, TensorFlow's own
    assert "hypertf offload" not in output
    agent = json.loads(w.stats_file.read_text())
    assert agent["products"] == 8


def test_a_processor_killed_mid_run_falls_back_to_local(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    go = tmp_path / "go"
    with world(2, tmp_path) as w:
        proc = start(w.task_env(1000, tmp_path / "stats.json"), out, "--pause", str(go))
        try:
            deadline = time.monotonic() + 60
            while not (out / "paused").exists():
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.05)
            ranks = processors_of(w.proc.pid)
            assert len(ranks) == 2, ranks
            os.kill(ranks[-1], signal.SIGKILL)
            w.proc.wait(30)  # mpiexec ends the whole world when a rank dies
            go.touch()
            output = finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        everything = [w.proc.pid, *ranks]
    check_results(out)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["ops"] == 3 and stats["fallbacks"] == 1, stats
    assert stats["failed"]
    warnings = [line for line in output.splitlines() if line.startswith("hypertf offload:")]
    assert len(warnings) == 1, output
    assert not [pid for pid in everything if alive(pid)]
    assert not shm_names(w.channel)


def processors_of(mpiexec: int) -> list[int]:
    """The PIDs of the processor ranks under this mpiexec (its descendants, by /proc)."""
    parents, commands = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            parents[int(entry)] = int(
                Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            commands[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue

    def under(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == mpiexec:
                return True
        return False

    return sorted(pid for pid, argv in commands.items()
                  if b"hypertf.offload.processor" in argv and under(pid))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(autouse=True)
def _quiet_tf() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def test_the_digits_example_trains_to_the_same_accuracy_offloaded(tmp_path):
    """examples/keras_fit.py (tf-keras model.fit under MultiWorkerMirroredStrategy),
    unmodified: every product offloaded, the same test accuracy (+-0.01) as without."""
    pytest.importorskip("tf_keras")
    pytest.importorskip("sklearn")
    example = Path(__file__).resolve().parents[2] / "examples" / "keras_fit.py"
    argv = [sys.executable, str(example), "--epochs", "3"]
    base = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    with world(2, tmp_path) as w:
        offloaded = subprocess.Popen(argv, env={**base, **w.task_env(1000, tmp_path / "s.json")},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        local = subprocess.Popen(argv, env=base, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        accuracy = {}
        for name, proc in (("local", local), ("offloaded", offloaded)):
            output = finish(proc, timeout=120)
            lines = [line for line in output.splitlines() if line.startswith("test_accuracy=")]
            assert lines, output[-2000:]
            accuracy[name] = float(lines[-1].split("=", 1)[1])
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["ops"] > 100 and stats["fallbacks"] == 0, stats
    assert abs(accuracy["local"] - accuracy["offloaded"]) <= 0.01, accuracy

"""Nodes enforce grants (docs/gpu.md, "Trespasses"): a process started outside HyperTF with
another job's GPU UUID, or claiming that job's key without being one of its tasks, is seen
by the host's agent, shown by ``status`` and ``/metrics``, and its process group stopped
(``hypertf_gpu_enforce: stop``, the default); the job that holds the GPU runs on."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import on_host, wait_for
from tests.launcher.helpers import FAKE, start_hypertf, status, task_key, until_line


def _alive(lab, host: str, pid: int) -> bool:
    return on_host(lab.inventory, host, f"kill -0 {pid} 2>/dev/null && echo yes || echo no"
                   ).strip() == "yes"


def test_a_process_on_another_jobs_gpu_is_reported_and_stopped(lab, tmp_path: Path):
    finish = tmp_path / "finish"
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "1",
                        "--", "--until_file", str(finish), cwd=tmp_path)
    key = task_key(until_line(job, "tasks listening"))
    report = status(lab.inventory)
    host, gpu = next((h["name"], g) for h in report["hosts"] for g in h["gpus"]
                     if g["task_key"] == key)
    uuid = gpu["uuid"]
    start = ("setsid sh -c 'exec sleep 300' >/dev/null 2>&1 </dev/null & echo $!")
    outsider = int(on_host(lab.inventory, host, f"CUDA_VISIBLE_DEVICES={uuid} {start}"))
    forger = int(on_host(lab.inventory, host,
                         f"HYPERTF_TASK_KEY={key} CUDA_VISIBLE_DEVICES={uuid} {start}"))
    try:
        seen = wait_for(lambda: [t for t in status(lab.inventory)["trespasses"]
                                 if t["pid"] in (outsider, forger)], 30,
                        "the trespasses reported")
        assert all(t["host"] == host and t["gpu"] == gpu["index"] and t["holder"] == key
                   and t["how"] == "env" and t["claims"] == "" for t in seen), seen
        wait_for(lambda: not _alive(lab, host, outsider) and not _alive(lab, host, forger),
                 30, "the trespassers stopped")
        assert job.poll() is None  # the job that holds the GPU runs on
    finally:
        on_host(lab.inventory, host, f"kill -9 {outsider} {forger} 2>/dev/null; true")
        finish.touch()
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 0, out
    wait_for(lambda: not status(lab.inventory)["trespasses"], 30, "the reports cleared")

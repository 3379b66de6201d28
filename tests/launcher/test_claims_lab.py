"""Claims the node can prove, on the lab (issue 48 item 4): on the host of a running job, the
node account writes a pid file into the job's run directory naming a process group of its
own (its true start time) that claims the job's key and names the job's GPU by index, and
another process names it by an upper-case UUID. The host's agent believes neither: both
are reported and stopped as trespasses while the job runs on; the job's run directory and
files are private (0700/0600); ``tasknode start`` into it is refused."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from hypertf.config.inventory import load_inventory
from tests.conftest import on_host, wait_for
from tests.launcher.helpers import FAKE, start_hypertf, status, task_key, until_line

SPAWN = "setsid sh -c 'exec sleep 300' >/dev/null 2>&1 </dev/null & echo $!"


def test_forged_claims_on_a_running_jobs_host_are_trespasses(lab, tmp_path: Path) -> None:
    finish = tmp_path / "finish"
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "1",
                        "--", "--until_file", str(finish), cwd=tmp_path)
    thieves: list[int] = []
    host = ""
    try:
        key = task_key(until_line(job, "tasks listening"))
        host, gpu = next((h["name"], g) for h in status(lab.inventory)["hosts"]
                         for g in h["gpus"] if g["task_key"] == key)
        node = load_inventory(lab.inventory).node(host)
        run = f"{node.settings.workdir}/runs/{key}"
        forger = int(on_host(lab.inventory, host, f"HYPERTF_TASK_KEY={key} "
                             f"CUDA_VISIBLE_DEVICES={gpu['index']} {SPAWN}"))
        thieves.append(forger)
        on_host(lab.inventory, host, f"echo {forger} $(cut -d' ' -f22 /proc/{forger}/stat) "
                                     f"> {run}/worker9.pid")
        upper = int(on_host(lab.inventory, host, f"HYPERTF_TASK_KEY={key} "
                            f"CUDA_VISIBLE_DEVICES={gpu['uuid'].upper()} {SPAWN}"))
        thieves.append(upper)

        reported: dict[int, dict] = {}  # each is stopped, and its report cleared, at once

        def both() -> bool:
            reported.update({t["pid"]: t for t in status(lab.inventory)["trespasses"]
                             if t["pid"] in thieves})
            return len(reported) == 2

        wait_for(both, 30, "both claims reported as trespasses")
        seen = list(reported.values())
        assert all(t["host"] == host and t["gpu"] == gpu["index"] and t["holder"] == key
                   and t["claims"] == "" and t["how"] == "env" for t in seen), seen
        wait_for(lambda: on_host(lab.inventory, host, " ".join(
            f"kill -0 {pid} 2>/dev/null && echo {pid};" for pid in thieves) + " true").strip()
            == "",
            30, "the trespassers stopped")

        modes = dict(line.split(" ", 1)[::-1] for line in on_host(
            lab.inventory, host, f"stat -c '%a %n' {run} {run}/worker0 {run}/worker0.log "
                                 f"{run}/worker0.pid {run}/started").splitlines())
        assert modes == {f"{run}": "700", f"{run}/worker0": "700",
                         f"{run}/worker0.log": "600", f"{run}/worker0.pid": "600",
                         f"{run}/started": "600"}, modes

        request = json.dumps({"run_dir": run, "venv": node.settings.venv, "tasks": [
            {"name": "worker5", "port": 1, "cwd": run, "argv": ["sleep", "300"],
             "env": {"HYPERTF_TASK_KEY": key}}]})
        said = on_host(lab.inventory, host, (
            f"echo {shlex.quote(request)} | {node.settings.venv}/bin/python -m "
            f"hypertf.node.tasknode start 2>&1; echo rc=$?")).strip().splitlines()
        assert said[-1] == "rc=7" and "already has tasks" in said[0], said
        assert job.poll() is None  # the job that holds the GPU runs on
    finally:
        if thieves and host:
            on_host(lab.inventory, host, f"kill -9 {' '.join(map(str, thieves))} "
                                         f"2>/dev/null; true")
        finish.touch()
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 0, out

"""``--env`` values stay secret (issue 38): tried as the thieves would, with their own valid
credentials. Another registered user (bob) reads the job record, ``hypertf jobs --json`` and
the dashboard's jobs; this user's ``hypertf logs`` and every file HyperTF wrote (here and on
the nodes) are searched; an unprivileged local user reads every ``/proc/*/cmdline`` and tries
the run directory; while the job runs and after it ended. The tasks did get the values."""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.core.rundir import make_private, write_private
from hypertf.dashboard import ClusterSource
from hypertf.launch.request import TrainRequest
from hypertf.store import credentials
from tests.conftest import on_host, wait_for
from tests.launcher.helpers import FAKE, all_free, finish_file, hypertf, processes_of

NOBODY = 65534
# Every process's command line, read as an unprivileged user (the value is not in this one).
DUMP_CMDLINES = ("import glob\n"
                 "for path in glob.glob('/proc/[0-9]*/cmdline'):\n"
                 "    try:\n"
                 "        print(open(path, 'rb').read().replace(b'\\0', b' ').decode('utf-8', "
                 "'replace'))\n"
                 "    except OSError:\n"
                 "        pass\n")


def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, user=NOBODY,
                          group=NOBODY, extra_groups=[], cwd="/")


def cmdlines_seen_by_nobody() -> str:
    done = as_nobody("/usr/bin/python3", "-c", DUMP_CMDLINES)
    assert done.returncode == 0, done.stderr
    assert "hypertf.launch.detach" in done.stdout  # it does see the launcher's line
    return done.stdout


def as_bob(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, credentials.IDENTITY_ENV: "user.bob"}
    return subprocess.run([sys.executable, "-m", "hypertf.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def everything_bob_reads(inventory_path: str, key: str, cwd: Path) -> str:
    """The job's record, ``jobs --json`` and the dashboard's jobs, as bob reads them."""
    inventory = load_inventory(inventory_path)
    client = store.connect(inventory.cluster, identity="user.bob")
    try:
        zk = store.Store(client, store.Layout(inventory.cluster.zk_root))
        record, _ = client.get(zk.layout.job(key))
        dashboard = json.dumps(ClusterSource(inventory, zk).jobs())
    finally:
        store.close(client)
    listed = as_bob("jobs", "--json", "-i", inventory_path, cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    assert key in listed.stdout and key in dashboard
    return "\n".join([record.decode(), listed.stdout, dashboard])


def files_on_nodes(inventory_path: str, key: str) -> str:
    """Every file of the job's run directory on every node, concatenated."""
    inventory = load_inventory(inventory_path)
    return "".join(on_host(inventory, host, f"find {inventory.node(host).settings.workdir}"
                           f"/runs/{key} -type f -exec cat {{}} + || true")
                   for host in inventory.nodes)


def files_here(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


@pytest.mark.lab
def test_env_values_are_kept_from_other_users_while_running_and_after(lab, tmp_path,
                                                                      monkeypatch):
    inventory = load_inventory(lab.inventory)
    store.secure_cluster(inventory.cluster, list(inventory.nodes), ["bob"])
    from_env = f"from-env-{secrets.token_hex(8)}"
    inline = f"inline-{secrets.token_hex(8)}"
    monkeypatch.setenv("WANDB_API_KEY", from_env)
    finish = finish_file(tmp_path)
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2", "--detach",
                   "--env", "WANDB_API_KEY", "--env", f"OTHER_TOKEN={inline}", "--",
                   "--until_file", str(finish), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    key = done.stdout.split()[0]
    run = tmp_path / "runs" / key
    wait_for(lambda: sum(map(len, processes_of(lab.inventory, key).values())) >= 2, 120,
             "both tasks to run")
    # the tasks have both values (ps eww as root shows their environment)
    environments = " ".join(" ".join(lines) for lines in processes_of(lab.inventory, key).values())
    assert f"WANDB_API_KEY={from_env}" in environments
    assert f"OTHER_TOKEN={inline}" in environments

    def leaks(text: str) -> list[str]:
        return [value for value in (from_env, inline) if value in text]

    # while it runs: records and lists, command lines, files here and on the nodes
    assert not leaks(everything_bob_reads(lab.inventory, key, tmp_path))
    assert not leaks(cmdlines_seen_by_nobody())
    assert not leaks(files_here(tmp_path)), sorted(str(p) for p in tmp_path.rglob("*"))
    assert not leaks(files_on_nodes(lab.inventory, key))
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert as_nobody("ls", str(run)).returncode != 0
    finish.touch()
    wait_for(lambda: (run / "summary.json").exists() and all_free(lab.inventory), 120,
             "the job to end and release")
    # after: the summary (here and in the record), the logs, the launcher's own log
    summary = json.loads((run / "summary.json").read_text())
    assert summary["result"] == "succeeded", summary
    assert all("WANDB_API_KEY" in names and "OTHER_TOKEN" in names
               for names in summary["env"].values()), summary["env"]
    assert stat.S_IMODE((run / "summary.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    logs = hypertf("logs", "-i", lab.inventory, key, cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    assert not leaks(logs.stdout + logs.stderr)
    assert not leaks(everything_bob_reads(lab.inventory, key, tmp_path))
    assert not leaks(files_here(tmp_path))
    assert not leaks(files_on_nodes(lab.inventory, key))


def test_env_name_alone_must_be_set_in_the_environment(tmp_path, monkeypatch):
    """``--env NAME`` with NAME unset is a usage error that says how to set it."""
    monkeypatch.delenv("HYPERTF_SURELY_UNSET", raising=False)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"all": {"vars": {"hypertf_zookeeper_hosts": "127.0.0.1:1"},
                                             "children": {"gpu_nodes": {"hosts": {
        "n1": {"ansible_connection": "local"}}}}}}))
    done = hypertf("train", "-i", str(inventory), "--script", FAKE,
                   "--env", "HYPERTF_SURELY_UNSET", cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "HYPERTF_SURELY_UNSET is not set in your environment" in done.stderr
    assert "Traceback" not in done.stderr


def test_env_name_takes_its_value_from_the_environment_and_files_get_names(tmp_path,
                                                                           monkeypatch):
    """``--env NAME`` reads NAME here; what goes into a file or onto a command line
    (``without_env_values``) holds names only; a run directory is 0700 and its summary 0600
    whatever the umask."""
    monkeypatch.setenv("HYPERTF_T_SECRET", "s3cret value")
    request = TrainRequest(script="x.py", env=("HYPERTF_T_SECRET", "B=in=line"))
    values = request.env_vars()
    assert values == {"HYPERTF_T_SECRET": "s3cret value", "B": "in=line"}
    assert request.env_names() == ["B", "HYPERTF_T_SECRET"]
    stripped = json.dumps(request.without_env_values().to_json())
    assert "s3cret" not in stripped and "in=line" not in stripped
    assert request.without_env_values().with_env(values).env_vars() == values
    old = os.umask(0o022)
    try:
        run = make_private(tmp_path / "runs" / "key")
        write_private(run / "summary.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert stat.S_IMODE(run.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((run / "summary.json").stat().st_mode) == 0o600

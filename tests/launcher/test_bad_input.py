"""Hostile or broken input to the launcher: a clear error, or the right thing; never a
traceback, and nothing allocated or started on a rejected request."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.launcher.helpers import FAKE, all_free, hypertf, processes_of, summaries

BAD_INVENTORIES = {
    "malformed": (b"all:\n  children: [gpu_nodes\n", "malformed YAML at line"),
    "truncated": (None, "hypertf: error: "),
    "wrong type": (b"all:\n  vars: {hypertf_gpu_util_max: high}\n  children:\n    gpu_nodes:\n"
                   b"      hosts: {a: {ansible_host: 10.0.0.1}}\n",
                   "hypertf_gpu_util_max must be a percentage between 0 and 100, not 'high'"),
    "non-utf8": (b"all:\n  hosts:\n    \xff\xfe: {}\n", "is not UTF-8 text"),
    "duplicate host": (b"all:\n  vars: {hypertf_zookeeper_hosts: 127.0.0.1:1}\n  children:\n"
                       b"    gpu_nodes:\n      hosts:\n        a: {ansible_host: 10.0.0.1}\n"
                       b"        a: {ansible_host: 10.0.0.2}\n", "'a' appears twice"),
    "same address twice": (b"all:\n  vars: {hypertf_zookeeper_hosts: 127.0.0.1:1}\n  children:\n"
                           b"    gpu_nodes:\n      hosts:\n        a: {ansible_host: 10.0.0.1}\n"
                           b"        b: {ansible_host: 10.0.0.1}\n",
                           "hosts 'a' and 'b' are the same node (10.0.0.1:22)"),
    "list on top": (b"- a\n- b\n", "the top level must be a mapping of groups"),
    "empty": (b"", "the inventory is empty"),
}


@pytest.mark.parametrize("case", sorted(BAD_INVENTORIES))
def test_bad_inventories(lab, tmp_path, case):
    content, message = BAD_INVENTORIES[case]
    if content is None:  # the lab's own inventory cut in the middle of a line
        text = Path(lab.inventory).read_bytes()
        content = text[: len(text) * 2 // 3]
    path = tmp_path / "inventory.yml"
    path.write_bytes(content)
    done = hypertf("train", "-i", str(path), "--script", FAKE, "--worker", "1", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert done.stderr.count("\n") <= 2 and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()


REQUESTS = [
    (["--worker", "0"], 2, "a job needs at least one worker"),
    (["--worker", "-1"], 2, "cannot be negative"),
    (["--ps", "-2"], 2, "cannot be negative"),
    (["--gpus-per-worker", "-1"], 2, "cannot be negative"),
    (["--worker", "100000"], 2, "more than the 1024 a job may have"),
    (["--worker", "500"], 4, "cannot place worker:12 (1 GPU on one host)"),
    (["--gpus-per-worker", "64"], 4, "cannot place worker:0 (64 GPUs on one host)"),
    (["--worker", "abc"], 2, "invalid int value: 'abc'"),
    (["--start-timeout", "0"], 2, "must be positive seconds"),
    (["--policy", "nope"], 2, "unknown policy 'nope'"),
    (["--sync", "/nonexistent"], 2, "--sync /nonexistent: no such directory"),
]


@pytest.mark.parametrize(("args", "code", "message"), REQUESTS,
                         ids=[" ".join(r[0]) for r in REQUESTS])
def test_bad_requests(lab, tmp_path, args, code, message):
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, *args, cwd=tmp_path)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert all_free(lab.inventory)


def test_unknown_host(lab, tmp_path):
    done = hypertf("agent-ctl", "status", "-i", lab.inventory, "--host", "h11", cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown host 'h11' (hosts of group 'gpu_nodes': h1, h2, h3). Did you mean 'h1'?" \
        in done.stderr


def test_shell_metacharacters_in_the_script_path_run_nothing(lab, tmp_path):
    canary = Path("/tmp") / f"hypertf-canary-{time.time_ns()}"
    done = hypertf("train", "-i", lab.inventory, "--script", f"x.py; touch {canary}",
                   "--worker", "1", cwd=tmp_path)
    assert done.returncode == 6, done.stderr
    assert f"script x.py; touch {canary} not found" in done.stderr
    assert not canary.exists()
    assert processes_of(lab.inventory) == {}


def test_script_path_with_spaces_runs(lab, tmp_path):
    folder = tmp_path / "my scripts (v2)"
    folder.mkdir()
    script = folder / "fake tf.py"
    shutil.copy(FAKE, script)
    done = hypertf("train", "-i", lab.inventory, "--script", str(script), "--worker", "2", "--",
                   "--work_s", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert summaries(tmp_path)[0]["result"] == "succeeded"
    assert all_free(lab.inventory)


def test_script_path_with_spaces_runs_from_sync_dir(lab, tmp_path):
    folder = tmp_path / "code dir"
    folder.mkdir()
    shutil.copy(FAKE, folder / "train me.py")
    done = hypertf("train", "-i", lab.inventory, "--sync", str(folder), "--script",
                   "train me.py", "--worker", "2", "--", "--work_s", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert all_free(lab.inventory)

"""Hostile or broken input to the launcher: a clear error, or the right thing; never a
traceback, and nothing allocated or started on a rejected request."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

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


# -- hostile input: each refused within seconds, one line, exit 2, nothing allocated ------
LAUGHS = "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9) if p else ', '.join(['lol'] * 9)}]\n"
                 for p, c in zip(["", *"abcdefgh"], "abcdefghi", strict=True))


def lab_variant(lab, edit) -> str:
    data = yaml.safe_load(Path(lab.inventory).read_text())
    edit(data)
    return yaml.safe_dump(data)


def set_all(key, value):
    return lambda inv: inv["all"]["vars"].__setitem__(key, value)


def rename_h1(name):
    def edit(inv):
        hosts = inv["all"]["children"]["gpu_nodes"]["hosts"]
        hosts[name] = hosts.pop("h1")
    return edit


HOSTILE_INVENTORIES = {
    "alias bomb (342 bytes)": (lambda lab: LAUGHS, "(an alias bomb?)"),
    "nesting 200 deep": (lambda lab: "all:\n  vars:\n    x: " + "[" * 200 + "]" * 200 + "\n",
                         "nesting deeper than 64 levels"),
    "9 MiB of hosts": (lambda lab: "# " + "x" * (9 * 1024 * 1024) + "\n",
                       "more than the 8 MiB an inventory file may have"),
    "host name h1;x": (lambda lab: lab_variant(lab, rename_h1("h1;x")),
                       "'h1;x' is not a valid host name"),
    "host name with a space": (lambda lab: lab_variant(lab, rename_h1("h 1")),
                               "is not a valid host name"),
    "relative workdir": (lambda lab: lab_variant(lab, set_all("hypertf_workdir", "srv/x")),
                         "hypertf_workdir must be an absolute path on the node, not 'srv/x'"),
    "templated venv": (lambda lab: lab_variant(lab, set_all("hypertf_venv", "{{ venv }}")),
                       "hypertf_venv '{{ venv }}' is a template"),
    "NUL byte in a value": (lambda lab: lab_variant(lab, set_all("ansible_user", "ro\0ot")),
                            "ansible_user holds a NUL byte"),
}


@pytest.mark.parametrize("case", list(HOSTILE_INVENTORIES))
def test_hostile_inventories(lab, tmp_path, case):
    make, message = HOSTILE_INVENTORIES[case]
    path = tmp_path / "inventory.yml"
    path.write_text(make(lab))
    done = hypertf("train", "-i", str(path), "--script", FAKE, "--worker", "1", cwd=tmp_path,
                   timeout=60)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()
    assert all_free(lab.inventory)


def test_symlink_loop_and_special_files_are_named(tmp_path):
    loop = tmp_path / "loop.yml"
    loop.symlink_to(loop)
    done = hypertf("status", "-i", str(loop), cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stderr == f"hypertf: error: inventory {loop} cannot be read: a symlink loop\n"
    done = hypertf("status", "-i", "/dev/null", cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert "inventory /dev/null is neither a file nor a directory" in done.stderr


def ini_inventory(lab) -> str:
    data = yaml.safe_load(Path(lab.inventory).read_text())["all"]
    lines = ["[all:vars]"]
    lines += [f"{k}={v}" for k, v in data["vars"].items() if k != "ansible_ssh_common_args"]
    lines.append("[gpu_nodes]")
    lines += [f"{h} ansible_host={v['ansible_host']}"
              for h, v in data["children"]["gpu_nodes"]["hosts"].items()]
    return "\n".join(lines) + "\n"


def test_ini_inventories_and_inventory_directories_work_as_in_ansible(lab, tmp_path):
    ini = tmp_path / "hosts.ini"
    ini.write_text(ini_inventory(lab))
    done = hypertf("train", "-i", str(ini), "--script", FAKE, "--worker", "2", "--",
                   "--work_s", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "inventory"
    (folder / "group_vars").mkdir(parents=True)
    data = yaml.safe_load(Path(lab.inventory).read_text())
    (folder / "group_vars" / "all.yml").write_text(yaml.safe_dump(data["all"].pop("vars")))
    (folder / "hosts.yml").write_text(yaml.safe_dump(data))
    done = hypertf("status", "--json", "-i", str(folder), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [h["agent"] for h in json.loads(done.stdout)["hosts"]] == ["up", "up", "up"]
    assert all_free(lab.inventory)


@pytest.mark.parametrize(("args", "message"), [
    (["--script", "/x/" + "y" * 100_000], "--script is 100003 bytes long; a path has at most"),
    (["--script", FAKE, "--worker", "1", "--", *(["w" * 100_000] * 12)],
     "the script's arguments total 1200012 bytes"),
])
def test_oversized_script_paths_and_arguments_are_refused(lab, tmp_path, args, message):
    done = hypertf("train", "-i", lab.inventory, *args, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert all_free(lab.inventory)


def test_a_100_kb_argument_reaches_two_tasks_on_one_host(lab, tmp_path):
    """The start script goes to the node on stdin: two tasks' 100 kB arguments on one
    host no longer make a command line over the kernel's limit."""
    big = "q" * 100_000
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2", "--policy",
                   "pack", "--", "--work_s", "0", "--big", big, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (summary,) = summaries(tmp_path)
    assert {t["host"] for t in summary["tasks"]} == {"h1"}
    for index in (0, 1):
        log = (tmp_path / "runs" / summary["task_key"] / f"worker{index}.log").read_text()
        argv = json.loads(log.split("argv=", 1)[1].splitlines()[0])
        assert argv[-2:] == ["--big", big]
    assert all_free(lab.inventory)

"""Preflight refuses broken hosts before anything is allocated; busy ports are retried."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.launcher.helpers import FAKE, all_free, hypertf, processes_of, summaries


def variant(lab, tmp_path: Path, edit) -> str:
    """A copy of the lab inventory changed by ``edit(inventory_dict)``."""
    data = yaml.safe_load(Path(lab.inventory).read_text())
    edited = copy.deepcopy(data)
    edit(edited)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(edited))
    return str(path)


def nothing_happened(lab) -> None:
    assert all_free(lab.inventory)
    assert processes_of(lab.inventory) == {}


def test_unknown_host_key_is_refused(lab, tmp_path):
    known = tmp_path / "known_hosts"
    lines = Path(lab.known_hosts).read_text().splitlines(keepends=True)
    h2 = lab.host("h2").address + " "
    known.write_text("".join(line for line in lines if not line.startswith(h2)))

    def edit(inv):
        inv["all"]["vars"]["hypertf_known_hosts"] = str(known)

    done = hypertf("train", "-i", variant(lab, tmp_path, edit), "--script", FAKE, "--worker", "3",
                   cwd=tmp_path)
    assert done.returncode == 6, done.stderr
    assert "preflight failed on 1 host(s); nothing was started or allocated:" in done.stderr
    address = lab.host("h2").address
    assert f"h2: h2 ({address}): host key unknown: it is not in {known}" in done.stderr
    assert "Traceback" not in done.stderr
    nothing_happened(lab)


def test_unreachable_host_is_named(lab, tmp_path):
    unused = lab.gateway.rsplit(".", 1)[0] + ".250"  # in the lab's own subnet, nobody there

    def edit(inv):
        inv["all"]["children"]["gpu_nodes"]["hosts"]["h3"]["ansible_host"] = unused
        inv["all"]["vars"]["hypertf_ssh_timeout"] = 2

    done = hypertf("train", "-i", variant(lab, tmp_path, edit), "--script", FAKE, "--worker", "3",
                   cwd=tmp_path)
    assert done.returncode == 6, done.stderr
    assert "preflight failed on 1 host(s)" in done.stderr
    assert f"h3: h3 ({unused}:22)" in done.stderr
    nothing_happened(lab)


def test_only_the_hosts_a_job_needs_are_preflighted(lab, tmp_path):
    """A broken node the job does not need (h3's venv) does not fail a 2-worker job."""
    def edit(inv):
        inv["all"]["children"]["gpu_nodes"]["hosts"]["h3"]["hypertf_venv"] = "/nonexistent"

    done = hypertf("train", "-i", variant(lab, tmp_path, edit), "--script", FAKE, "--worker", "2",
                   "--", "--work_s", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [t["host"] for t in summaries(tmp_path)[0]["tasks"]] == ["h1", "h2"]


def test_missing_script_is_reported_per_host(lab, tmp_path):
    done = hypertf("train", "-i", lab.inventory, "--script", "/nonexistent/train.py",
                   "--worker", "3", cwd=tmp_path)
    assert done.returncode == 6, done.stderr
    assert "preflight failed on 3 host(s)" in done.stderr
    for host in ("h1", "h2", "h3"):
        assert f"  {host}: script /nonexistent/train.py not found" in done.stderr
    nothing_happened(lab)


def test_missing_venv_is_reported_per_host(lab, tmp_path):
    def edit(inv):
        inv["all"]["vars"]["hypertf_venv"] = "/nonexistent/venv"

    done = hypertf("train", "-i", variant(lab, tmp_path, edit), "--script", FAKE, "--worker", "3",
                   cwd=tmp_path)
    assert done.returncode == 6, done.stderr
    assert "preflight failed on 3 host(s)" in done.stderr
    assert "h1: the virtualenv /nonexistent/venv has no python with HyperTF" in done.stderr
    nothing_happened(lab)


@pytest.mark.parametrize(("request_args", "code"), [
    (["--worker", "0"], 2), (["--worker", "-1"], 2), (["--worker", "13"], 4),
    (["--worker", "2", "--policy", "x"], 2)])
def test_impossible_or_invalid_requests(lab, tmp_path, request_args, code):
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, *request_args, cwd=tmp_path)
    assert done.returncode == code, done.stderr
    assert done.stderr.startswith("hypertf: error: ")
    assert "Traceback" not in done.stderr
    if "13" in request_args:
        assert "cannot place worker:12 (1 GPU on one host)" in done.stderr
        assert "h1: 4 of 4 free (GPU 0, 1, 2, 3)" in done.stderr
    nothing_happened(lab)


def test_taken_port_is_retried_on_a_fresh_one(lab, tmp_path):
    from hypertf.config.inventory import load_inventory
    from hypertf.launch.remote import Session

    def edit(inv):
        # within the lab's own range: the keeper (the lab's agents) refuses ports outside it
        inv["all"]["vars"]["hypertf_port_range"] = "20990-20999"

    inventory = variant(lab, tmp_path, edit)
    inv = load_inventory(inventory)
    session = Session(inv.node("h1"), inv.cluster)
    squatter = session.run(
        "setsid nohup python3 -c 'import socket,time; s=socket.socket(); "
        "s.bind((\"0.0.0.0\", 20990)); s.listen(); time.sleep(300)' "
        "> /dev/null 2>&1 < /dev/null & echo $!").stdout.strip()
    try:
        done = hypertf("train", "-i", inventory, "--script", FAKE, "--worker", "1",
                       "--policy", "pack", "--", "--work_s", "0", cwd=tmp_path)
    finally:
        session.run(f"kill {squatter}")
        session.close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "could not bind its port: retrying on fresh ports" in done.stdout
    final = [s for s in summaries(tmp_path) if s["result"] == "succeeded"]
    assert [t["port"] for t in final[0]["tasks"]] == [20991]
    assert all_free(lab.inventory)


def test_a_second_job_takes_preflight_from_the_cache_until_the_script_is_gone(lab, tmp_path):
    """Preflight answers are kept per host, venv and script digest: a second job (a sweep's
    next trial, a retried job) does not ask the nodes again; a script no longer there is
    checked, and refused, again."""
    import shutil

    script = tmp_path / "train.py"  # a path of this test's own: the first job misses
    shutil.copy(FAKE, script)
    notes = []
    for run in ("first", "second"):
        cwd = tmp_path / run
        cwd.mkdir()
        done = hypertf("train", "-i", lab.inventory, "--script", str(script), "--worker", "2",
                       "--", "--work_s", "0", cwd=cwd)
        assert done.returncode == 0, done.stdout + done.stderr
        (summary,) = summaries(cwd)
        notes.append(sorted((e["host"], e.get("note", "")) for e in summary["timeline"]
                            if e["phase"] == "preflight"))
    assert notes == [[("h1", ""), ("h2", "")], [("h1", "cached"), ("h2", "cached")]]
    script.unlink()
    done = hypertf("train", "-i", lab.inventory, "--script", str(script), "--worker", "2",
                   cwd=tmp_path)
    assert done.returncode == 6, done.stderr
    assert "preflight failed on 2 host(s)" in done.stderr
    assert f"  h1: script {script} not found" in done.stderr
    nothing_happened(lab)

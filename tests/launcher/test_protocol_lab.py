"""A node on another protocol version is refused before anything starts (issue 41 item 1).

h2 runs the real ``tasknode`` through a ``python`` of a venv made here whose preflight
answer names the next protocol version (its output rewritten on the way out): a node
upgraded ahead of the launcher. Nothing in HyperTF itself lets a node report another
version than its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from hypertf.core.protocol import PROTOCOL_VERSION
from tests.launcher.helpers import FAKE, all_free, hypertf, processes_of


def newer_venv(tmp_path: Path) -> Path:
    """A venv whose python is this one, its preflight answer saying version N+1."""
    venv = tmp_path / "venv-next"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'{sys.prefix}/bin/python "$@" | sed \'s/"protocol": {PROTOCOL_VERSION}}}/'
        f'"protocol": {PROTOCOL_VERSION + 1}}}/\'\n')
    python.chmod(0o755)
    return venv


def test_a_node_on_another_protocol_version_is_one_line_and_exit_6(lab, tmp_path):
    data = yaml.safe_load(Path(lab.inventory).read_text())
    data["all"]["children"]["gpu_nodes"]["hosts"]["h2"]["hypertf_venv"] = str(
        newer_venv(tmp_path))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))

    done = hypertf("train", "-i", str(inventory), "--script", FAKE, "--worker", "3",
                   cwd=tmp_path)
    assert done.returncode == 6, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("hypertf: error:")]
    assert errors == [
        f"hypertf: error: HyperTF versions differ: h2 on node protocol {PROTOCOL_VERSION + 1}, "
        f"this launcher on protocol {PROTOCOL_VERSION}: run invoke cluster.setup to install "
        f"this HyperTF on the nodes (nothing was started or allocated)"], done.stderr
    assert done.stderr.rstrip().endswith(errors[0]), "the refusal is the last word"
    assert "Traceback" not in done.stderr
    assert all_free(lab.inventory)
    assert processes_of(lab.inventory) == {}

"""The preflight cache: an answer is reused only for the same host, venv, script content and
host key file, only for its TTL, and never after the host failed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hypertf.config.inventory import Inventory, load_inventory
from hypertf.launch.preflightcache import PreflightCache

ANSWER = {"python": "/opt/venv/bin/python", "problems": [], "legacy_flags": True,
          "tf_keras": False}


class Clock:
    """The cache's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def inventory(tmp_path: Path, venv: str = "/opt/venv", address: str = "10.0.0.1") -> Inventory:
    path = tmp_path / f"cluster-{abs(hash((venv, address)))}.yml"
    path.write_text(textwrap.dedent(f"""
        all:
          vars:
            hypertf_zookeeper_hosts: "zk.example:2181"
            hypertf_venv: {venv}
            hypertf_workdir: /srv/hypertf
            hypertf_known_hosts: {tmp_path / "known_hosts"}
          children:
            gpu_nodes:
              hosts:
                n1:
                  ansible_host: {address}
                n2:
                  ansible_host: 10.0.0.2
        """).lstrip("\n"))
    return load_inventory(path)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Inventory, Path, Clock, Path]:
    (tmp_path / "known_hosts").write_text("10.0.0.1 ssh-ed25519 AAAA...\n")
    script = tmp_path / "train.py"
    script.write_text("print('v1')\n")
    return inventory(tmp_path), script, Clock(), tmp_path / "cache.json"


def cache(inv: Inventory, script: Path | str, clock: Clock, path: Path,
          ttl: float = 120) -> PreflightCache:
    return PreflightCache(inv.cluster.known_hosts, str(script), ttl=ttl, path=path, clock=clock)


def test_an_answer_is_reused_within_its_ttl_only(setup):
    inv, script, clock, path = setup
    cache(inv, script, clock, path).put([(inv.node("n1"), ANSWER)])
    assert cache(inv, script, clock, path).get(inv.nodes.values()) == {"n1": ANSWER}
    clock.now += 119
    assert cache(inv, script, clock, path).get(inv.nodes.values()) == {"n1": ANSWER}
    clock.now += 2
    assert cache(inv, script, clock, path).get(inv.nodes.values()) == {}
    assert path.stat().st_mode & 0o077 == 0  # the user's only


def test_a_changed_script_venv_address_or_host_key_file_is_a_miss(setup, tmp_path):
    inv, script, clock, path = setup
    cache(inv, script, clock, path).put([(inv.node("n1"), ANSWER)])
    other_venv = inventory(tmp_path, venv="/opt/other")
    assert cache(other_venv, script, clock, path).get([other_venv.node("n1")]) == {}
    moved = inventory(tmp_path, address="10.0.0.9")
    assert cache(moved, script, clock, path).get([moved.node("n1")]) == {}
    script.write_text("print('v2')\n")  # the answer (legacy flags) depends on its content
    assert cache(inv, script, clock, path).get([inv.node("n1")]) == {}
    script.write_text("print('v1')\n")
    assert cache(inv, script, clock, path).get([inv.node("n1")]) == {"n1": ANSWER}
    Path(inv.cluster.known_hosts).write_text("")  # a host key removed: ask (and fail) again
    assert cache(inv, script, clock, path).get([inv.node("n1")]) == {}


def test_a_failed_host_is_forgotten_and_the_cache_can_be_off(setup):
    inv, script, clock, path = setup
    cache(inv, script, clock, path).put([(inv.node("n1"), ANSWER), (inv.node("n2"), ANSWER)])
    cache(inv, script, clock, path).forget(["n1"])
    assert cache(inv, script, clock, path).get(inv.nodes.values()) == {"n2": ANSWER}
    assert cache(inv, script, clock, path, ttl=0).get(inv.nodes.values()) == {}
    path.write_text("{not json")  # a damaged file is an empty cache, then replaced
    assert cache(inv, script, clock, path).get(inv.nodes.values()) == {}
    cache(inv, script, clock, path).put([(inv.node("n2"), ANSWER)])
    assert cache(inv, script, clock, path).get(inv.nodes.values()) == {"n2": ANSWER}


def test_a_script_only_the_nodes_have_is_never_cached(setup):
    """A relative or missing script has no local content to key the answer by."""
    inv, _script, clock, path = setup
    for script in ("train.py", "/nonexistent/train.py"):
        missing = cache(inv, script, clock, path)
        missing.put([(inv.node("n1"), ANSWER)])
        assert missing.get([inv.node("n1")]) == {}


def test_an_edited_module_the_script_imports_is_a_miss(setup):
    """The answer's legacy flags may come from a module beside the script (round 5's
    tf_cnn_benchmarks): editing it must ask the nodes again."""
    inv, script, clock, path = setup
    module = script.parent / "flags_here.py"
    module.write_text("FLAGS = None\n")
    script.write_text("import flags_here\n")
    cache(inv, script, clock, path).put([(inv.node("n1"), ANSWER)])
    assert cache(inv, script, clock, path).get([inv.node("n1")]) == {"n1": ANSWER}
    module.write_text("import argparse\nargparse.ArgumentParser().add_argument('--ps_hosts')\n")
    assert cache(inv, script, clock, path).get([inv.node("n1")]) == {}

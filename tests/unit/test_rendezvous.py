"""Every framework's rendezvous (hypertf.core.rendezvous): ranks in TF_CONFIG's order,
the coordinator on rank 0's granted port, torchrun's local and node ranks by host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypertf.core import spec
from hypertf.core.rendezvous import RENDEZVOUS_ENV, split_address
from hypertf.core.scheduler import Placement
from hypertf.core.taskenv import RESERVED_ENV


def _build(placements: list[Placement]) -> dict[str, spec.TaskSpec]:
    ports = iter(range(20001, 20100))
    hosts = {"h1": "10.0.0.1", "h2": "10.0.0.2"}
    addresses = {p.name: f"{hosts[p.host]}:{next(ports)}" for p in placements}
    return {s.placement.name: s for s in spec.build(placements, addresses)}


def test_ranks_follow_tf_configs_order_and_torchrun_counts_by_host() -> None:
    # two tasks on h2, one on h1, listed out of order: the ranks follow TF_CONFIG
    built = _build([Placement("worker", 2, "h1", ()), Placement("worker", 0, "h2", ()),
                    Placement("worker", 1, "h2", ())])
    env = {name: s.rendezvous for name, s in built.items()}
    assert [env[f"worker:{i}"]["RANK"] for i in range(3)] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in env.values()} == {"3"}
    # h2 holds rank 0: it is node 0 with local ranks 0 and 1; h1 is node 1
    assert [(env[f"worker:{i}"]["NODE_RANK"], env[f"worker:{i}"]["LOCAL_RANK"],
             env[f"worker:{i}"]["LOCAL_WORLD_SIZE"]) for i in range(3)] == [
        ("0", "0", "2"), ("0", "1", "2"), ("1", "0", "1")]
    # the coordinator is rank 0's address and granted port, the same in every task
    cluster = json.loads(built["worker:0"].tf_config)["cluster"]["worker"]
    assert {e["JAX_COORDINATOR_ADDRESS"] for e in env.values()} == {cluster[0]}
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in env.values()} == {
        split_address(cluster[0])}
    assert env["worker:1"]["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == ",".join(cluster)
    assert env["worker:2"]["KERAS_DISTRIBUTION_PROCESS_ID"] == env["worker:2"]["RANK"]
    assert env["worker:2"]["JAX_PROCESS_ID"] == "2"


def test_a_chief_is_rank_zero_and_every_variable_is_reserved() -> None:
    built = _build([Placement("ps", 0, "h1", ()), Placement("worker", 0, "h1", ()),
                    Placement("chief", 0, "h2", ())])
    assert built["chief:0"].rendezvous["RANK"] == "0"
    assert built["worker:0"].rendezvous["RANK"] == "1"
    assert built["ps:0"].rendezvous["RANK"] == "2"
    for task_spec in built.values():
        assert tuple(task_spec.rendezvous) == RENDEZVOUS_ENV
    # a user's --env of one of them would be lost without a word: they are refused by name
    assert set(RENDEZVOUS_ENV) <= RESERVED_ENV


def test_an_ipv6_address_is_split_without_its_brackets() -> None:
    assert split_address("[fd00::1]:20001") == ("fd00::1", "20001")
    assert split_address("10.0.0.1:20001") == ("10.0.0.1", "20001")


def test_a_users_env_of_one_of_them_is_refused_by_name() -> None:
    import pytest

    from hypertf.config.settings import check_env

    with pytest.raises(ValueError, match="MASTER_PORT is set by HyperTF for every task"):
        check_env("MASTER_PORT", "1234", "--env")


def test_readiness_waits_for_the_right_ports() -> None:
    from hypertf.core.monitor import must_listen
    from hypertf.core.rendezvous import Readiness

    job = [Placement("worker", 1, "h2", ()), Placement("chief", 0, "h1", ()),
           Placement("worker", 0, "h1", ())]
    assert must_listen(job) == {"chief:0", "worker:0", "worker:1"}
    assert must_listen(job, Readiness.COORDINATOR) == {"chief:0"}  # rank 0 alone
    assert must_listen(job, Readiness.NONE) == frozenset()
    assert must_listen(job[:1], Readiness.COORDINATOR) == frozenset()  # no peer: no port


def test_the_script_says_when_it_rendezvouses_on_a_coordinator() -> None:
    from hypertf.core.rendezvous import Readiness, detect

    assert detect(["import jax\n"], {}) == (Readiness.COORDINATOR, "it imports jax")
    assert detect(["from jax.experimental import multihost_utils\n"], {})[0] is \
        Readiness.COORDINATOR
    assert detect(["import torch.distributed as dist\n"], {})[0] is Readiness.COORDINATOR
    keras_jax = 'import os\nos.environ["KERAS_BACKEND"] = "jax"\nimport keras\n'
    assert detect([keras_jax], {}) == (Readiness.COORDINATOR,
                                       "it imports keras with KERAS_BACKEND=jax")
    assert detect(["import keras\n"], {"KERAS_BACKEND": "jax"})[0] is Readiness.COORDINATOR
    assert detect(["import keras\n"], {}) == (None, "")  # Keras on TensorFlow: as before
    assert detect(["import tensorflow as tf\n", "def broken(:\n"], {}) == (None, "")


def test_a_nodes_reason_with_control_characters_is_not_known() -> None:
    """The reason a node's preflight gives is said on the launcher's terminal: an answer
    whose text carries control characters counts as no answer (today's TensorFlow way)."""
    from hypertf.core.protocol import PreflightAnswer

    honest = PreflightAnswer.parse({"python": "p", "problems": [], "coordinator": "it imports jax"})
    assert honest.coordinator == "it imports jax"
    forged = PreflightAnswer.parse({"python": "p", "problems": [], "coordinator": "\x1b[2Jx"})
    assert forged.coordinator is None


# -- the mode said at start (Job.announce_flags): one line, right for one task too ---------------
ONE_HOST = ("all:\n  vars:\n    hypertf_zookeeper_hosts: 'zk.example:2181'\n"
            "  children:\n    gpu_nodes:\n      hosts:\n        h1: {ansible_host: 10.0.0.1}\n")


def _said(tmp_path: Path, source: str, **request: Any) -> list[str]:
    """The lines that name the rendezvous, as a job says them before it starts."""
    from hypertf.config.inventory import load_inventory
    from hypertf.launch.launcher import Job
    from hypertf.launch.request import TrainRequest

    (tmp_path / "cluster.yml").write_text(ONE_HOST)
    (tmp_path / "train.py").write_text(source)
    said: list[str] = []
    Job(load_inventory(tmp_path / "cluster.yml"),
        TrainRequest(script=str(tmp_path / "train.py"), **request), said.append).announce_flags()
    return [line for line in said if "rendezvous" in line]


def test_a_one_task_coordinator_job_says_no_port_must_open(tmp_path: Path) -> None:
    """must_listen is empty for one task: the line says so, not "rank 0's port must open"."""
    assert _said(tmp_path, "import jax\n", workers=1) == [
        "hypertf: rendezvous: coordinator (a single task: no port must open before the "
        "start-up deadline): the script imports jax; --rendezvous tf|coordinator|none chooses"]


def test_the_option_is_named_once_as_the_reason(tmp_path: Path) -> None:
    assert _said(tmp_path, "import tensorflow\n", workers=2, rendezvous="none") == [
        "hypertf: rendezvous: none (no port must open: the tasks are judged by their exits "
        "alone): chosen by --rendezvous none"]
    assert _said(tmp_path, "import tensorflow\n", workers=1, rendezvous="coordinator") == [
        "hypertf: rendezvous: coordinator (a single task: no port must open before the "
        "start-up deadline): chosen by --rendezvous coordinator"]


def test_tensorflows_mode_is_said_in_one_line_for_two_tasks_or_more(tmp_path: Path) -> None:
    assert _said(tmp_path, "import tensorflow\n", workers=2, ps=1) == [
        "hypertf: rendezvous: tf (every task's port must open before the start-up deadline): "
        "the script imports no jax, torch or keras on jax; --rendezvous tf|coordinator|none "
        "chooses"]
    assert _said(tmp_path, "import tensorflow\n", workers=1) == []  # one task: nothing to say

"""What ``hypertf train`` accepts before it touches ZooKeeper or a node.

``TrainRequest.validate`` rejects requests that cannot be valid on any cluster (exit code 2,
a message naming the option); ``parse_train`` splits HyperTF's options from the script's own
arguments, which must reach the script verbatim. No lab, no ZooKeeper, no network.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.exceptions import ConnectionLoss

from hypertf.cli import main as cli
from hypertf.core.errors import (
    HyperTFError,
    InsufficientResources,
    Interrupted,
    InventoryError,
    LabError,
    RemoteError,
    StoreError,
    UsageError,
)
from hypertf.launch.attempt import JobFailed
from hypertf.launch.request import TrainRequest

# -- TrainRequest.validate ------------------------------------------------------------------

INVALID = {
    "negative workers": ({"workers": -1}, ["--worker"]),
    "negative ps": ({"ps": -2}, ["--ps"]),
    "negative gpus per worker": ({"gpus_per_worker": -1}, ["GPU counts", "negative"]),
    "negative gpus per ps": ({"gpus_per_ps": -1}, ["GPU counts", "negative"]),
    "no worker and no chief": ({"workers": 0}, ["--worker", "--chief"]),
    "too many tasks": ({"workers": 1000, "ps": 24, "chief": True}, ["1025 tasks", "1024"]),
    "unknown policy": ({"policy": "random"}, ["policy", "'random'", "round_robin", "pack"]),
    "zero start timeout": ({"start_timeout": 0}, ["--start-timeout"]),
    "negative start timeout": ({"start_timeout": -5}, ["--start-timeout"]),
    "zero timeout": ({"timeout": 0}, ["--timeout"]),
    "negative timeout": ({"timeout": -1.5}, ["--timeout"]),
    "negative offload hosts": ({"offload_hosts": -1}, ["--offload-hosts", "0..256"]),
    "too many offload hosts": ({"offload_hosts": 257}, ["--offload-hosts", "257"]),
    "negative offload flops": ({"offload_min_flops": -1}, ["--offload-min-flops"]),
}


@pytest.mark.parametrize(("fields", "words"), list(INVALID.values()), ids=list(INVALID))
def test_validate_rejects_impossible_requests_as_usage_errors(
        fields: dict, words: list[str]) -> None:
    """A request no cluster can run is the user's to fix: exit code 2, the option named."""
    with pytest.raises(UsageError) as caught:
        TrainRequest(script="train.py", **fields).validate()
    assert caught.value.exit_code == 2
    for word in words:
        assert word in str(caught.value)


def test_validate_rejects_a_missing_sync_dir(tmp_path: Path) -> None:
    """--sync uploads a directory: one that is not there is a usage error, named."""
    missing = tmp_path / "nowhere"
    with pytest.raises(UsageError, match="--sync") as caught:
        TrainRequest(script="train.py", sync_dir=str(missing)).validate()
    assert caught.value.exit_code == 2
    assert str(missing) in str(caught.value)


def test_validate_rejects_a_script_missing_from_the_sync_dir(tmp_path: Path) -> None:
    """With --sync the script is relative to the synced dir; it must be in there."""
    (tmp_path / "other.py").write_text("")
    (tmp_path / "sub").mkdir()  # a directory named like the script is not a script
    for script in ("train.py", "sub"):
        with pytest.raises(UsageError, match="--script") as caught:
            TrainRequest(script=script, sync_dir=str(tmp_path)).validate()
        assert caught.value.exit_code == 2
        assert script in str(caught.value) and str(tmp_path) in str(caught.value)


VALID = {
    "defaults": {},
    "chief only": {"workers": 0, "chief": True},
    "ps and workers": {"workers": 3, "ps": 2},
    "ps, workers and chief": {"workers": 2, "ps": 1, "chief": True, "gpus_per_ps": 1},
    "CPU only": {"gpus_per_worker": 0},
    "pack": {"policy": "pack"},
    "exactly 1024 tasks": {"workers": 1000, "ps": 23, "chief": True},
    "whole-job timeout": {"timeout": 0.5, "start_timeout": 0.5},
}


@pytest.mark.parametrize("fields", list(VALID.values()), ids=list(VALID))
def test_validate_accepts_runnable_requests(fields: dict) -> None:
    """Valid shapes must not be refused before the cluster is even asked."""
    TrainRequest(script="train.py", **fields).validate()


def test_validate_accepts_a_script_inside_the_sync_dir(tmp_path: Path) -> None:
    """--sync DIR with --script relative to it (also in a subdirectory)."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "train.py").write_text("")
    TrainRequest(script="models/train.py", sync_dir=str(tmp_path)).validate()


# -- parse_train ----------------------------------------------------------------------------


def test_parse_train_defaults() -> None:
    """The documented defaults: one worker, no ps, round_robin, 120 s start-up, 5 s grace."""
    args = cli.parse_train(["--script", "train.py"])
    assert args.script == "train.py"
    assert (args.worker, args.ps, args.chief) == (1, 0, False)
    assert args.policy == "round_robin"
    assert (args.gpus_per_worker, args.gpus_per_ps) == (1, 0)
    assert args.start_timeout == 120.0 and args.timeout is None
    assert args.grace == 5.0
    assert args.sync is None and cli.train_request(args).legacy_flags == "auto"
    assert args.hyperparameters == []
    assert args.command == "train" and args.func is cli.cmd_train


def test_parse_train_reads_every_option() -> None:
    """Each HyperTF option lands in its field with its type."""
    args = cli.parse_train([
        "-i", "inv.yml", "--script", "t.py", "--worker", "4", "--ps", "2", "--chief",
        "--policy", "pack", "--gpus-per-worker", "2", "--gpus-per-ps", "1", "--sync", "code",
        "--start-timeout", "30", "--timeout", "600", "--grace", "0.5", "--no-legacy-flags",
    ])
    assert args.inventory == "inv.yml"
    assert (args.worker, args.ps, args.chief, args.policy) == (4, 2, True, "pack")
    assert (args.gpus_per_worker, args.gpus_per_ps, args.sync) == (2, 1, "code")
    assert (args.start_timeout, args.timeout, args.grace) == (30.0, 600.0, 0.5)
    assert cli.train_request(args).legacy_flags == "off" and args.hyperparameters == []


def test_parse_train_double_dash_passes_everything_after_it_to_the_script() -> None:
    """After '--' even HyperTF's own option names (and later '--') belong to the script."""
    args = cli.parse_train(["--script", "t.py", "--worker", "2", "--",
                            "--worker", "5", "--ps", "1", "--", "x"])
    assert args.worker == 2 and args.ps == 0
    assert args.hyperparameters == ["--worker", "5", "--ps", "1", "--", "x"]


def test_parse_train_keeps_unknown_options_verbatim() -> None:
    """Spaces, quotes, '$(...)', '=' and negative numbers reach the script unchanged."""
    script_args = ["--lr", "-0.5", "--note", "a b 'c' \"d\"", "--cmd", "$(rm -rf ~)",
                   "--batch=64", "--tag=x y", "`id`", "--work", "3"]
    args = cli.parse_train(["--script", "t.py", *script_args[:4], "--worker", "3",
                            *script_args[4:]])
    assert args.worker == 3
    assert args.hyperparameters == script_args
    assert "--work" in args.hyperparameters, "no abbreviation of --worker"


def test_parse_train_unknown_options_come_before_the_double_dash_ones() -> None:
    """Both sources of script arguments are kept, in command-line order."""
    args = cli.parse_train(["--steps", "500", "--script", "t.py", "--", "--batch_size", "100"])
    assert args.script == "t.py"
    assert args.hyperparameters == ["--steps", "500", "--batch_size", "100"]


def test_parse_train_requires_a_script(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --script there is nothing to run: argparse's usage error, exit code 2."""
    with pytest.raises(SystemExit) as caught:
        cli.parse_train(["--worker", "2", "--", "--script", "t.py"])
    assert caught.value.code == 2
    assert "--script" in capsys.readouterr().err


def test_parse_train_rejects_a_count_that_is_not_a_number(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A typo in a HyperTF option is a usage error (2), not a hyperparameter."""
    with pytest.raises(SystemExit) as caught:
        cli.parse_train(["--script", "t.py", "--worker", "two"])
    assert caught.value.code == 2
    assert "--worker" in capsys.readouterr().err


# -- exit codes -------------------------------------------------------------------------------


@pytest.mark.parametrize(("error", "code"), [
    (InventoryError, 2), (UsageError, 2), (StoreError, 3), (InsufficientResources, 4),
    (LabError, 5), (RemoteError, 6), (JobFailed, 1), (HyperTFError, 1), (Interrupted, 130),
])
def test_cli_exit_codes_follow_the_readme_table(
        error: type[HyperTFError], code: int, capsys: pytest.CaptureFixture[str]) -> None:
    """Scripts branch on these: 2 usage, 3 ZooKeeper, 4 GPUs, 5 lab, 6 node, 1 job, 130."""

    def fail() -> int:
        raise error("what went wrong")

    assert cli.run(fail) == code
    assert capsys.readouterr().err == "hypertf: error: what went wrong\n"


def test_cli_maps_zookeeper_outages_and_ctrl_c(capsys: pytest.CaptureFixture[str]) -> None:
    """A kazoo exception is an outage (3), not a traceback; Ctrl-C is 130."""

    def outage() -> int:
        raise ConnectionLoss()

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert cli.run(outage) == 3
    assert "ZooKeeper failed (ConnectionLoss" in capsys.readouterr().err
    assert cli.run(interrupted) == 130
    assert "interrupted" in capsys.readouterr().err


def test_an_argument_longer_than_the_kernel_passes_is_refused() -> None:
    """Only reachable through the Python API or a sweep: the shell cannot pass one either."""
    from hypertf.launch.request import TrainRequest

    with pytest.raises(UsageError, match="a script argument of 200000 bytes is longer than"):
        TrainRequest(script="train.py", args=("--big", "z" * 200_000)).validate()
    with pytest.raises(UsageError, match="cannot hold NUL bytes"):
        TrainRequest(script="train.py", args=("a\0b",)).validate()


@pytest.mark.parametrize("item, message", [
    ("HYPERTF_SURELY_UNSET", "is not set in your environment"),  # NAME: from os.environ
    ("NO-EQUALS", "must look like NAME=VALUE or NAME"),
    ("1ABC=x", "is not an environment variable name"),
    ("A-B=x", "is not an environment variable name"),
    ("CUDA_VISIBLE_DEVICES=0", "is set by HyperTF"),
    ("A=x\0y", "NUL byte"),
])
def test_a_bad_env_is_a_usage_error(item, message):
    with pytest.raises(UsageError, match=message):
        TrainRequest(script="x.py", env=(item,)).validate()


def test_env_values_keep_equals_signs_and_spaces():
    request = TrainRequest(script="x.py", env=("A=b=c d", "EMPTY="))
    assert request.env_vars() == {"A": "b=c d", "EMPTY": ""}

"""How the sweep driver records a trial whose launcher ended: its state from the exit, and
the TensorBoard files as a by-product that cannot end the sweep (hypertf/sweep/driver.py)."""

from __future__ import annotations

import signal

import pytest

from hypertf.sweep.driver import Driver, Sweep


@pytest.fixture
def one_trial(tmp_path, monkeypatch):
    """A sweep of one running trial, in a fresh working directory (sweeps live in runs/)."""
    monkeypatch.chdir(tmp_path)
    trial = {"index": 0, "params": {"lr": 0.1}, "args": ["--lr", "0.1"], "label": "lr=0.1",
             "state": "running", "tries": 1, "task_key": "20261127-000000-abcdef.alice",
             "started": 1.7e9}
    sweep = Sweep("sweep-test", "inventory.yml", {}, [trial])
    sweep.save()
    (sweep.dir / "trial-0.log").write_text("hypertf: job done\n")
    return sweep, trial


@pytest.mark.parametrize(("code", "state"), [
    (0, "succeeded"), (1, "failed"), (8, "cancelled"), (130, "cancelled"),
    (-signal.SIGINT, "cancelled"),  # Ctrl-C that reached a launcher still importing
    (-signal.SIGKILL, "lost"),  # killed outright: nobody said why
])
def test_a_trials_state_follows_its_launchers_exit(one_trial, code, state):
    sweep, trial = one_trial
    Driver(sweep, {}, say=lambda _line: None).finish(trial, code)
    assert trial["state"] == state


def test_a_board_that_cannot_be_written_does_not_end_the_sweep(one_trial):
    """The TensorBoard files are a by-product: their failure is one line, the trial's result
    is recorded and the driver goes on (it once ran code that could end it there)."""
    sweep, trial = one_trial
    (sweep.dir / "tensorboard").write_text("a file where the board's folder goes")
    said: list[str] = []
    Driver(sweep, {}, say=said.append).finish(trial, 0)
    assert trial["state"] == "succeeded"
    assert any("not written for TensorBoard" in line for line in said), said
    assert '"succeeded"' in (sweep.dir / "results.json").read_text()

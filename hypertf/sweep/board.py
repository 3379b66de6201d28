"""A sweep in TensorBoard: each trial as an HParams session under
``runs/sweeps/<id>/tensorboard``, so ``tensorboard --logdir runs/sweeps/<id>/tensorboard``
shows the table, parallel-coordinates and scatter views of the trials.

::

    tensorboard/events.out.tfevents.*.config   the experiment: every parameter (with the
                                               values seen so far) and the metric
    tensorboard/trial-<n>/events.out.tfevents.*  trial n: its parameters and its metric

Written by the sweep's driver each time it records a trial's result; a trial run again
(``resume``) replaces its own run. Protobufs are written with TensorBoard's own event
writer: no TensorFlow graph or session is needed. Without tensorboard installed nothing is
written (a sweep does not depend on it).

The protobufs come from ``tensorboard.plugins.hparams.summary_v2``, the module behind the
public ``hparams.api``, and not from ``api`` itself, and the files are written without
``EventFileWriter``: both import TensorFlow where it is installed, which held the driver
~2 s (and ~0.5 GB) at its first finished trial, so the next trials started and were
reaped that much later (bench/sweep.py).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TENSORBOARD = "tensorboard"
CONFIG_SUFFIX = ".config"


def board_dir(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / TENSORBOARD


def _write(directory: Path, summaries: Sequence[Any], suffix: str, step: int = 0) -> None:
    """One event file of ``summaries``, framed by TensorBoard's ``RecordWriter`` into a
    plain file: its ``EventFileWriter`` opens files through ``tf.io.gfile``, which imports
    TensorFlow wherever it is installed."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob(f"events.out.tfevents.*{suffix}"):
        old.unlink()  # one current file per run: a rewritten config, a re-run trial
    now = time.time()
    name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.0{suffix}"
    writer = RecordWriter(open(directory / name, "wb"))  # noqa: SIM115  # closed below
    try:
        writer.write(Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
        for summary in summaries:
            writer.write(Event(wall_time=now, summary=summary, step=step).SerializeToString())
    finally:
        writer.close()


def _domain(values: list[Any]) -> Any:
    """A Discrete domain of the values seen, when they share one type (else none)."""
    from tensorboard.plugins.hparams import summary_v2 as hp

    kinds = {bool if isinstance(v, bool) else float if isinstance(v, (int, float)) else type(v)
             for v in values}
    if len(kinds) != 1 or kinds.pop() not in (bool, float, str):
        return None
    return hp.Discrete(sorted(set(values)))


def _value(value: Any) -> Any:
    """HParams take bool, number or text: anything else (lists) as its text."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def record_trial(sweep_dir: Path, metric: str | None, trials: Sequence[Mapping[str, Any]],
                 trial: Mapping[str, Any]) -> Path | None:
    """Write ``trial`` (its params and metric) and the experiment of all ``trials``; the
    trial's run directory, or None where tensorboard is not installed."""
    try:
        from tensorboard.plugins.hparams import summary_v2 as hp
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    except ImportError:
        return None
    tag = metric or "metric"
    names = sorted({name for each in trials for name in each.get("params", {})})
    hparams = [hp.HParam(name, _domain([_value(t["params"][name]) for t in trials
                                        if name in t.get("params", {})]))
               for name in names]
    board = board_dir(sweep_dir)
    _write(board, [hp.hparams_config_pb(hparams=hparams, metrics=[
        hp.Metric(tag, display_name=tag)])], CONFIG_SUFFIX)
    run = board / f"trial-{trial['index']}"
    summaries = [hp.hparams_pb({name: _value(v) for name, v in trial["params"].items()},
                               trial_id=str(trial.get("label") or trial["index"]),
                               start_time_secs=trial.get("started"))]
    if isinstance(trial.get("metric"), (int, float)):
        summaries.append(scalar_pb(tag, float(trial["metric"])))
    _write(run, summaries, ".trial")
    return run

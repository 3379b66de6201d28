"""A sweep's trials as TensorBoard HParams sessions, read back with TensorBoard's own reader."""

from __future__ import annotations

import pytest

from hypertf.sweep import board as sweepboard

pytest.importorskip("tensorboard")


def read_run(directory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"tensors": 0})
    events.Reload()
    return events


def trial(index, lr, batch, metric, state="succeeded"):
    return {"index": index, "params": {"lr": lr, "batch_size": batch}, "state": state,
            "label": f"lr={lr},batch_size={batch}", "metric": metric, "started": 1.7e9}


def test_trials_are_written_as_hparams_sessions_with_their_metric(tmp_path):
    from tensorboard.plugins.hparams.metadata import (
        EXPERIMENT_TAG,
        SESSION_START_INFO_TAG,
        parse_experiment_plugin_data,
        parse_session_start_info_plugin_data,
    )
    from tensorboard.util import tensor_util

    trials = [trial(0, 0.1, 32, 0.81), trial(1, 0.01, 64, 0.93), trial(2, 0.5, 32, None,
                                                                         "failed")]
    for each in trials:
        sweepboard.record_trial(tmp_path, "accuracy", trials, each)
    sweepboard.record_trial(tmp_path, "accuracy", trials, trials[1])  # recorded again: once
    board = tmp_path / "tensorboard"
    assert sorted(p.name for p in board.iterdir() if p.is_dir()) == \
        ["trial-0", "trial-1", "trial-2"]
    assert len(list((board / "trial-1").glob("events.out.tfevents.*"))) == 1

    root = read_run(board)
    content = root.SummaryMetadata(EXPERIMENT_TAG).plugin_data.content
    experiment = parse_experiment_plugin_data(content)
    assert [h.name for h in experiment.hparam_infos] == ["batch_size", "lr"]
    assert [v.number_value for v in experiment.hparam_infos[1].domain_discrete.values] == \
        [0.01, 0.1, 0.5]
    assert [m.name.tag for m in experiment.metric_infos] == ["accuracy"]

    best = read_run(board / "trial-1")
    start = parse_session_start_info_plugin_data(
        best.SummaryMetadata(SESSION_START_INFO_TAG).plugin_data.content)
    assert start.hparams["lr"].number_value == 0.01
    assert start.hparams["batch_size"].number_value == 64
    assert start.group_name == "lr=0.01,batch_size=64"
    [metric] = best.Tensors("accuracy")
    assert tensor_util.make_ndarray(metric.tensor_proto).item() == pytest.approx(0.93)

    failed = read_run(board / "trial-2")
    assert "accuracy" not in failed.Tags()["tensors"]


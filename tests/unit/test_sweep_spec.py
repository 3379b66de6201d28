"""Sweep specs, expansion and the results table (pure): errors people get, deterministic
trials, ranking, files."""

from __future__ import annotations

import csv
import json

import pytest

from hypertf.errors import UsageError
from hypertf.sweepspec import (
    SweepSpec,
    TrialResult,
    best,
    expand,
    load_spec,
    parse_grid_option,
    read_metrics,
    render_table,
    sort_results,
    to_csv,
    to_json,
)


def test_grid_options_parse_values_and_keep_order():
    grid = parse_grid_option(["lr=0.1,0.01", "batch_size=32,64", "opt=adam"])
    assert grid == {"lr": [0.1, 0.01], "batch_size": [32, 64], "opt": ["adam"]}
    trials = expand(SweepSpec("s.py", grid=grid))
    assert [t.args() for t in trials][:2] == [
        ["--lr", "0.1", "--batch_size", "32", "--opt", "adam"],
        ["--lr", "0.1", "--batch_size", "64", "--opt", "adam"]]
    assert len(trials) == 4 and trials[3].label() == "lr=0.01,batch_size=64,opt=adam"


@pytest.mark.parametrize("bad", ["lr", "=1", "lr=", "1lr=2", "a b=1"])
def test_bad_grid_options_name_the_form(bad):
    with pytest.raises(UsageError, match="--grid"):
        parse_grid_option([bad])


def test_a_grid_name_given_twice_is_refused():
    with pytest.raises(UsageError, match="twice"):
        parse_grid_option(["lr=1", "lr=2"])


@pytest.mark.parametrize(("text", "message"), [
    ("script: s.py\ngrid: {lr: [1]}\nepochs: 3\n", "unknown key"),
    ("grid: {lr: [1]}\n", "script"),
    ("script: s.py\n", "grid or a random"),
    ("script: s.py\ngrid: {lr: []}\n", "non-empty list"),
    ("script: s.py\ngrid: {lr: [1]}\nmode: best\n", "max or min"),
    ("script: s.py\nrandom: {lr: {loguniform: [0, 1]}}\n", "lo > 0"),
    ("script: s.py\nrandom: {lr: {normal: [0, 1]}}\n", "one of"),
    ("script: s.py\ngrid: {lr: [1]}\nmax_concurrent: 0\n", "max_concurrent"),
    ("- a list\n", "mapping"),
    ("script: [unclosed\n", "not valid YAML"),
])
def test_bad_specs_get_one_message_naming_the_key(tmp_path, text, message):
    path = tmp_path / "spec.yml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_spec(str(path))


def test_a_missing_spec_file_is_named(tmp_path):
    with pytest.raises(UsageError, match="cannot read sweep spec"):
        load_spec(str(tmp_path / "nope.yml"))


def test_random_search_is_the_same_for_the_same_seed_and_differs_for_another(tmp_path):
    path = tmp_path / "spec.yml"
    path.write_text("script: s.py\nseed: 3\nnum_samples: 4\ngrid: {bs: [16, 32]}\n"
                    "random: {lr: {loguniform: [0.0001, 0.1]}, layers: {randint: [1, 4]},"
                    " act: {choice: [relu, tanh]}, drop: {uniform: [0, 0.5]}}\n")
    spec = load_spec(str(path))
    first, second = expand(spec), expand(load_spec(str(path)))
    assert first == second and len(first) == 8  # 2 grid points x 4 samples
    assert all(0.0001 <= t.params["lr"] <= 0.1 and 1 <= t.params["layers"] <= 4
               for t in first)
    other = expand(SweepSpec(**{**spec.__dict__, "seed": 4}))
    assert [t.params for t in other] != [t.params for t in first]


def results():
    return [TrialResult(0, {"lr": 0.1}, "succeeded", "k0", 0.5, 3.0),
            TrialResult(1, {"lr": 0.2}, "succeeded", "k1", None, 2.0),
            TrialResult(2, {"lr": 0.3}, "failed", "k2", None, 1.0, "boom"),
            TrialResult(3, {"lr": 0.4}, "succeeded", "k3", 0.9, 4.0)]


def test_ranking_puts_the_best_first_and_trials_without_metric_last():
    assert [r.index for r in sort_results(results(), "max")] == [3, 0, 1, 2]
    assert [r.index for r in sort_results(results(), "min")] == [0, 3, 1, 2]
    assert best(results(), "max").index == 3
    assert best([results()[1]], "max") is None


def test_results_files_and_table(tmp_path):
    to_csv(results(), tmp_path / "r.csv", "max")
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [r["index"] for r in rows] == ["3", "0", "1", "2"] and rows[0]["lr"] == "0.4"
    to_json(results(), tmp_path / "r.json", {"sweep": "s1"}, "max")
    payload = json.loads((tmp_path / "r.json").read_text())
    assert payload["best"]["index"] == 3 and payload["sweep"] == "s1"
    table = render_table(results(), "max", "acc")
    assert table.splitlines()[0].split()[:4] == ["#", "lr", "STATE", "ACC"]
    assert table.splitlines()[-1] == "best: trial 3 (lr=0.4): acc=0.9"
    assert render_table(results()[1:3], "max", "acc").endswith("no trial reported a metric)")


@pytest.mark.parametrize(("text", "metric", "value"), [
    ('{"acc": 0.9, "loss": 1}', "acc", 0.9),
    ('{"acc": 0.9}', None, 0.9),
    ('{"acc": 0.9, "loss": 1}', None, None),
    ('{"acc": "high"}', "acc", None),
    ('{"acc": true}', "acc", None),
    ("[0.9]", "acc", None),
    ("not json", "acc", None),
    ("", None, None),
])
def test_metrics_files_never_crash_a_sweep(text, metric, value):
    assert read_metrics(text, metric) == value

"""Sweep specs, expansion and the results table (pure): errors people get, deterministic
trials, ranking, files."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from hypertf.core.errors import UsageError
from hypertf.sweep.spec import (
    SweepSpec,
    TrialResult,
    best,
    expand,
    load_spec,
    metric_fields,
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


# -- hardened specs (issue 20, item 11) -----------------------------------------------------
def spec_file(tmp_path, text):
    path = tmp_path / "spec.yml"
    path.write_text(text)
    return str(path)


def test_exponents_without_a_dot_are_numbers_in_ranges_and_grids(tmp_path):
    """PyYAML reads 1e-5 as text (YAML 1.1); a spec reads it as YAML 1.2 and users do."""
    spec = load_spec(spec_file(tmp_path, "script: s.py\nnum_samples: 5\n"
                                         "grid: {wd: [1e-4, 1E-3]}\n"
                                         "random: {lr: {loguniform: [1e-5, 1e-1]},"
                                         " drop: {uniform: ['0', '5e-1']}}\n"))
    assert spec.random["lr"] == {"loguniform": [1e-5, 1e-1]}
    assert spec.random["drop"] == {"uniform": [0.0, 0.5]}  # quoted numbers are numbers too
    assert spec.grid["wd"] == [1e-4, 1e-3]
    assert all(1e-5 <= t.params["lr"] <= 1e-1 for t in expand(spec))


@pytest.mark.parametrize(("text", "message"), [
    ("random: {lr: {loguniform: [small, 1]}}\nnum_samples: 2\n",
     r"random.lr.loguniform: 'small' is not a number; write numbers, e.g. \[1e-5, 1e-1\]"),
    ("random: {lr: {uniform: [0, .inf]}}\nnum_samples: 2\n", "not a finite number"),
    ("random: {n: {randint: [1, 2.5]}}\nnum_samples: 2\n", "whole numbers.*use uniform"),
    ("random: {lr: {uniform: [1]}}\nnum_samples: 2\n", r"needs \[lo, hi\] \(two numbers\)"),
    ("grid: {lr: [0.1, 0.01, 0.1]}\n", "grid.lr lists 0.1 twice: keep one"),
    ("grid: {lr: [1e-5, 0.00001]}\n", "lists 1e-05 twice"),
    ("grid: {lr: [1]}\ngrid: {bs: [2]}\n", "line 3, column 1: 'grid' appears twice.*keep one"),
    ("grid: {lr: [1], lr: [2]}\n", "'lr' appears twice in the same mapping; keep one"),
    ("grid: {lr: [1]}\nrandom: {lr: {uniform: [0, 1]}}\nnum_samples: 2\n",
     "lr is in both grid and random; keep each hyperparameter in one of them"),
    ("grid: {lr: [1]}\nnum_samples: 4\n", "remove num_samples or add random"),
    ("random: {lr: {uniform: [0, 1]}}\n", "needs num_samples"),
])
def test_hardened_spec_mistakes_get_one_line_naming_the_fix(tmp_path, text, message):
    with pytest.raises(UsageError, match=message) as caught:
        load_spec(spec_file(tmp_path, "script: s.py\n" + text))
    assert "\n" not in str(caught.value)


def test_a_grid_option_value_given_twice_is_refused():
    with pytest.raises(UsageError, match=r"--grid lr lists 0\.1 twice"):
        parse_grid_option(["lr=0.1,0.01,0.1"])
    assert parse_grid_option(["flag=1,true"]) == {"flag": [1, "true"]}


def test_nan_and_infinite_metrics_are_recorded_and_ranked_last(tmp_path):
    assert math.isnan(read_metrics('{"acc": NaN}', "acc"))
    assert read_metrics('{"acc": -Infinity}', None) == -math.inf
    assert metric_fields(math.nan) == {"metric": None, "unranked_metric": "nan"}
    assert metric_fields(0.5) == {"metric": 0.5, "unranked_metric": None}
    trials = [TrialResult(0, {"lr": 0.1}, "succeeded", "k0", math.nan),
              TrialResult(1, {"lr": 0.2}, "succeeded", "k1", 0.5),
              TrialResult(2, {"lr": 0.3}, "failed", "k2"),
              TrialResult(3, {"lr": 0.4}, "succeeded", "k3", None,
                          unranked_metric="inf"),  # as a sweep's record keeps it
              TrialResult(4, {"lr": 0.5}, "succeeded", "k4", math.inf),
              TrialResult(5, {"lr": 0.6}, "succeeded", "k5", 0.7)]
    for mode in ("max", "min"):
        assert [r.index for r in sort_results(trials, mode)][2:] == [0, 3, 4, 2]
    assert best(trials, "max").index == 5 and best(trials, "min").index == 1
    assert best(trials[:1], "max") is None
    table = render_table(trials, "max", "acc").splitlines()
    assert table[3].split()[2:4] == ["succeeded", "nan"]
    assert table[-2] == ("unranked: trial(s) 0 (nan), 3 (inf), 4 (inf) reported acc as NaN or "
                         "infinity: ranked last; check the training for divergence")
    assert table[-1] == "best: trial 5 (lr=0.6): acc=0.7"

    def strict(constant):
        raise AssertionError(f"results.json holds {constant}, which is not JSON")

    to_json(trials, tmp_path / "r.json", {}, "max")
    payload = json.loads((tmp_path / "r.json").read_text(), parse_constant=strict)
    assert [t["unranked_metric"] for t in payload["trials"][2:5]] == ["nan", "inf", "inf"]
    to_csv(trials, tmp_path / "r.csv", "max")
    assert [r["metric"] for r in csv.DictReader((tmp_path / "r.csv").open())] == [
        "0.7", "0.5", "nan", "inf", "inf", ""]


def test_the_driver_records_a_nan_metric_and_says_it_is_ranked_last(tmp_path, monkeypatch):
    from hypertf.core.rundir import RunDir
    from hypertf.launch.request import TrainRequest
    from hypertf.sweep import driver as sweeps

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweeps.sweepboard, "record_trial", lambda *a: None)  # imports TF: 20 s
    spec = SweepSpec("s.py", grid={"lr": [0.1, 0.2]})
    sweep = sweeps.create("inv.yml", TrainRequest(script="s.py"), expand(spec), "acc", "max", 2,
                          None)
    said: list[str] = []
    driver = sweeps.Driver(sweep, {}, say=said.append)
    for trial, reported in zip(sweep.trials, ("NaN", "0.25"), strict=True):
        key = f"key{trial['index']}"
        trial.update(task_key=key, started=0.0)
        run = RunDir.of(".", key, local=True)
        run.local.mkdir(parents=True)
        Path(run.summary).write_text(json.dumps({"task_key": key, "result": "succeeded"}))
        Path(run.metrics).write_text(f'{{"acc": {reported}}}')
        (sweep.dir / f"trial-{trial['index']}.log").write_text("")
        driver.finish(trial, 0)
    assert said[0].endswith("succeeded, acc=nan (not a finite number: ranked last)")
    saved = sweeps.Sweep.load(sweep.sweep_id)
    assert (saved.trials[0]["metric"], saved.trials[0]["unranked_metric"]) == (None, "nan")
    assert best(saved.results(), "max").index == 1
    assert "unranked: trial(s) 0 (nan)" in saved.table()


def test_a_sweep_stores_its_train_request_and_each_trial_adds_its_arguments(tmp_path,
                                                                             monkeypatch):
    """sweep.json holds the TrainRequest as JSON (not a command line); a trial runs that
    request with its hyperparameters after the script's own arguments, from a request file.
    Both files hold --env names only (issue 38): the values go to the launcher's stdin."""
    import json

    from hypertf.launch.detach import ENV_ON_STDIN
    from hypertf.launch.request import TrainRequest
    from hypertf.sweep import driver as sweeps

    monkeypatch.chdir(tmp_path)
    asked = TrainRequest(script="s.py", workers=2, priority=3, env=("A=s3cret-1",),
                         args=("--x", "1"))
    spec = SweepSpec("s.py", grid={"lr": [0.1, 0.2]})
    sweep = sweeps.create("inv.yml", asked, expand(spec), "acc", "max", 2, None)
    saved = json.loads((sweep.dir / "sweep.json").read_text())
    assert saved["request"]["workers"] == 2 and "train_argv" not in saved
    loaded = sweeps.Sweep.load(sweep.sweep_id)
    driver = sweeps.Driver(loaded, asked.env_vars())
    trial = loaded.trials[1]
    argv = driver.trial_argv(trial, "k.me")
    assert argv[1:3] == ["-m", "hypertf.launch.detach"] and argv[-2:] == ["k.me", ENV_ON_STDIN]
    ran = TrainRequest.from_json(json.loads(Path(argv[-3]).read_text()))
    assert ran == TrainRequest(script="s.py", workers=2, priority=3, env=("A",),
                               args=("--x", "1", *trial["args"]))
    assert ran.args[-2:] == ("--lr", "0.2")
    assert ran.with_env(driver.env).env_vars() == {"A": "s3cret-1"}
    for path in (sweep.dir / "sweep.json", Path(argv[-3])):
        assert "s3cret" not in path.read_text() and path.stat().st_mode & 0o777 == 0o600
    assert sweep.dir.stat().st_mode & 0o777 == 0o700


def test_a_resumed_sweep_takes_its_env_values_from_the_environment(tmp_path, monkeypatch):
    """``resume`` has no values saved: it reads the --env names again, and an unset one is
    one usage error naming it and where it is read."""
    from hypertf.launch.request import TrainRequest
    from hypertf.sweep import driver as sweeps

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYPERTF_T_SWEEP_SECRET", raising=False)
    asked = TrainRequest(script="s.py", env=("HYPERTF_T_SWEEP_SECRET=v1",))
    sweep = sweeps.create("inv.yml", asked, expand(SweepSpec("s.py", grid={"lr": [0.1]})),
                          None, "max", 1, None)
    with pytest.raises(UsageError, match=r"HYPERTF_T_SWEEP_SECRET is not set.*sweep resume"):
        sweeps.Sweep.load(sweep.sweep_id).env_values()
    monkeypatch.setenv("HYPERTF_T_SWEEP_SECRET", "v2")
    assert sweeps.Sweep.load(sweep.sweep_id).env_values() == {"HYPERTF_T_SWEEP_SECRET": "v2"}


def test_a_request_with_a_field_this_version_does_not_know_is_refused_by_name():
    from hypertf.launch.request import TrainRequest

    with pytest.raises(UsageError, match="does not know: gpus_per_evaluator"):
        TrainRequest.from_json({"script": "s.py", "gpus_per_evaluator": 2})

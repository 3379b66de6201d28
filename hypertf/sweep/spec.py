"""A sweep's spec, its trials and its results table: pure (no ZooKeeper, no processes).

Expansion is deterministic: a grid is the product in the order given (first name slowest);
a random search draws each sample from ``random.Random("<seed>:<sample>")``, independent of
Python's hash randomisation, so the same spec gives the same trials in any process.

A spec is read as YAML 1.2 reads numbers (``1e-5`` is a float; PyYAML's YAML 1.1 would make
it text), with duplicate keys refused; each mistake is one line that names the fix.
A trial's metric is a finite number or nothing: NaN and infinity are kept as text
(``unranked_metric``; JSON has none of them) and such trials are ranked after every
trial with a number.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from hypertf.config.yamlguard import UniqueKeyLoader
from hypertf.core.errors import UsageError

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
KEYS = ("script", "train", "grid", "random", "num_samples", "seed", "max_concurrent",
        "max_failed", "metric", "mode")
DISTRIBUTIONS = ("uniform", "loguniform", "choice", "randint")


class SpecLoader(UniqueKeyLoader):
    """Safe YAML, duplicate keys refused, and exponents without a dot (``1e-5``) as floats,
    as YAML 1.2 and every user read them."""

    error = UsageError


EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")
SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT,
                                 list("-+0123456789."))


@dataclass(frozen=True)
class SweepSpec:
    script: str
    train: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    random: dict[str, dict[str, Any]] = field(default_factory=dict)
    num_samples: int = 1
    seed: int = 0
    max_concurrent: int = 2
    max_failed: int | None = None
    metric: str | None = None
    mode: str = "max"


@dataclass(frozen=True)
class Trial:
    index: int
    params: dict[str, Any]

    def args(self) -> list[str]:
        """``--name value`` for each hyperparameter, appended to the script's arguments."""
        return [part for name, value in self.params.items() for part in (f"--{name}",
                                                                        str(value))]

    def label(self) -> str:
        return ",".join(f"{name}={value}" for name, value in self.params.items())


def _value(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise UsageError(f"{where}: {name!r} is not a hyperparameter name (letters, digits, "
                         f"'_', '.', '-', not starting with a digit)")
    return name


def parse_grid_option(values: Sequence[str]) -> dict[str, list[Any]]:
    """``--grid lr=0.1,0.01 --grid batch_size=32,64`` as an ordered mapping."""
    grid: dict[str, list[Any]] = {}
    for item in values:
        name, sep, listed = item.partition("=")
        items = [v for v in listed.split(",") if v != ""]
        if not sep or not name or not items:
            raise UsageError(f"--grid {item!r} must look like NAME=V1,V2 (e.g. "
                             f"--grid lr=0.1,0.01)")
        _check_name(name, "--grid")
        if name in grid:
            raise UsageError(f"--grid {name} is given twice: list all its values in one")
        grid[name] = _distinct([_value(v) for v in items], f"--grid {name}")
    return grid


def _distinct(values: list[Any], where: str) -> list[Any]:
    """The values, refused when one is listed twice (the same trial would run twice)."""
    for i, value in enumerate(values):
        if any(value == earlier and isinstance(value, bool) == isinstance(earlier, bool)
               for earlier in values[:i]):
            raise UsageError(f"{where} lists {value!r} twice: keep one (each grid value is "
                             f"a trial of its own)")
    return values


def _positive_int(payload: Mapping[str, Any], key: str, default: Any, low: int = 1) -> Any:
    value = payload.get(key, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UsageError(f"sweep spec: {key} must be a whole number >= {low}, not {value!r}")
    return value


def _number(value: Any, where: str, whole: bool) -> int | float:
    """A bound of a numeric range: a number, or text that reads as one ("1e-5")."""
    number: Any = value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise UsageError(f"sweep spec: {where}: {value!r} is not a number; write numbers, "
                         f"e.g. [1e-5, 1e-1]")
    if not math.isfinite(number):
        raise UsageError(f"sweep spec: {where}: {value!r} is not a finite number")
    if whole:
        if number != int(number):
            raise UsageError(f"sweep spec: {where}: randint takes whole numbers, not "
                             f"{value!r}; use uniform for fractions")
        return int(number)
    return number


def _check_distribution(name: str, spec: Any) -> dict[str, Any]:
    if not isinstance(spec, Mapping) or len(spec) != 1 or next(iter(spec)) not in DISTRIBUTIONS:
        raise UsageError(f"sweep spec: random.{name} must be one of {{uniform: [lo, hi]}}, "
                         f"{{loguniform: [lo, hi]}}, {{randint: [lo, hi]}}, {{choice: [...]}}")
    kind, args = next(iter(spec.items()))
    where = f"random.{name}.{kind}"
    if kind == "choice":
        if not isinstance(args, list) or not args:
            raise UsageError(f"sweep spec: {where} needs a non-empty list")
        return {kind: list(args)}
    if not isinstance(args, list) or len(args) != 2:
        raise UsageError(f"sweep spec: {where} needs [lo, hi] (two numbers), not {args!r}")
    low, high = (_number(a, where, whole=kind == "randint") for a in args)
    if not low < high:
        raise UsageError(f"sweep spec: {where} needs [lo, hi] with lo < hi, not {args!r}")
    if kind == "loguniform" and low <= 0:
        raise UsageError(f"sweep spec: {where} needs [lo, hi] with lo > 0 (a log scale), "
                         f"not {args!r}")
    return {kind: [low, high]}


def load_spec(path: str) -> SweepSpec:
    """A sweep spec YAML, checked: one message per mistake, naming the key."""
    try:
        payload = yaml.load(Path(path).read_text(), Loader=SpecLoader)
    except OSError as err:
        raise UsageError(f"cannot read sweep spec {path}: {err.strerror or err}") from err
    except UsageError as err:
        raise UsageError(f"sweep spec {path}: {err}") from err
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        problem = " ".join(str(err).split())
        raise UsageError(f"sweep spec {path} is not valid YAML: {problem}") from err
    if not isinstance(payload, Mapping):
        raise UsageError(f"sweep spec {path} must be a mapping with keys {', '.join(KEYS)}")
    unknown = sorted(set(payload) - set(KEYS))
    if unknown:
        raise UsageError(f"sweep spec {path}: unknown key(s) {', '.join(unknown)}; the keys "
                         f"are {', '.join(KEYS)}")
    script = payload.get("script")
    if not isinstance(script, str) or not script.strip():
        raise UsageError(f"sweep spec {path}: script (the training script) is required")
    train = payload.get("train") or {}
    grid = payload.get("grid") or {}
    randoms = payload.get("random") or {}
    for key, value in (("train", train), ("grid", grid), ("random", randoms)):
        if not isinstance(value, Mapping):
            raise UsageError(f"sweep spec {path}: {key} must be a mapping")
    for name, values in grid.items():
        _check_name(name, "sweep spec grid")
        if not isinstance(values, list) or not values:
            raise UsageError(f"sweep spec: grid.{name} must be a non-empty list of values")
        _distinct(values, f"sweep spec: grid.{name}")
    if not grid and not randoms:
        raise UsageError(f"sweep spec {path}: give a grid or a random search (or both)")
    both = [name for name in grid if name in randoms]
    if both:
        raise UsageError(f"sweep spec {path}: {', '.join(both)} is in both grid and random; "
                         f"keep each hyperparameter in one of them")
    distributions = {_check_name(k, "sweep spec random"): _check_distribution(k, v)
                     for k, v in randoms.items()}
    if "num_samples" in payload and not randoms:
        raise UsageError(f"sweep spec {path}: num_samples is the number of random draws, and "
                         f"there is no random search; remove num_samples or add random")
    if randoms and "num_samples" not in payload:
        raise UsageError(f"sweep spec {path}: a random search needs num_samples (how many "
                         f"draws, e.g. num_samples: 8)")
    mode = payload.get("mode", "max")
    if mode not in ("max", "min"):
        raise UsageError(f"sweep spec: mode must be max or min, not {mode!r}")
    metric = payload.get("metric")
    if metric is not None and not isinstance(metric, str):
        raise UsageError(f"sweep spec: metric must be a name, not {metric!r}")
    seed = payload.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"sweep spec: seed must be a whole number, not {seed!r}")
    return SweepSpec(
        script=script.strip(), train=dict(train), grid={k: list(v) for k, v in grid.items()},
        random=distributions,
        num_samples=_positive_int(payload, "num_samples", 1),
        seed=seed, max_concurrent=_positive_int(payload, "max_concurrent", 2),
        max_failed=_positive_int(payload, "max_failed", None, low=0), metric=metric,
        mode=mode)


def _round(value: float) -> float:
    return float(f"{value:.6g}")


def _draw(generator: random.Random, spec: Mapping[str, Any]) -> Any:
    kind, args = next(iter(spec.items()))
    if kind == "choice":
        return generator.choice(args)
    if kind == "randint":
        return generator.randint(int(args[0]), int(args[1]))
    if kind == "uniform":
        return _round(generator.uniform(args[0], args[1]))
    return _round(math.exp(generator.uniform(math.log(args[0]), math.log(args[1]))))


def expand(spec: SweepSpec) -> list[Trial]:
    """Every trial, in a fixed order: grid points (product), times random samples."""
    names = list(spec.grid)
    points = [dict(zip(names, values, strict=True))
              for values in itertools.product(*(spec.grid[n] for n in names))]
    if not spec.random:
        return [Trial(i, point) for i, point in enumerate(points)] if names else []
    samples = []
    for sample in range(spec.num_samples):
        generator = random.Random(f"{spec.seed}:{sample}")
        samples.append({name: _draw(generator, dist) for name, dist in spec.random.items()})
    combined = [{**point, **drawn} for point in (points or [{}]) for drawn in samples]
    return [Trial(i, params) for i, params in enumerate(combined)]


# -- trial states and results ---------------------------------------------------------------
class TrialState(StrEnum):
    """A trial's state in ``sweep.json``; each equals its text, so the file stays plain JSON
    and a trial read back from it compares equal to the members. A trial goes pending ->
    queued (its task key saved, its launcher starting) -> running (its launcher lives; its
    job may still wait in the queue) -> succeeded, failed, lost or cancelled; ``resume``
    takes the RERUN_TRIALS back to pending."""

    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"  # its launcher was killed outright, or went away with the sweep's driver
    CANCELLED = "cancelled"  # the sweep was cancelled (or its launcher was, or Ctrl-C)


LIVE_TRIALS = (TrialState.QUEUED, TrialState.RUNNING)  # a launcher of the driver's
ENDED_TRIALS = (TrialState.SUCCEEDED, TrialState.FAILED, TrialState.LOST, TrialState.CANCELLED)
RERUN_TRIALS = (TrialState.FAILED, TrialState.LOST, TrialState.CANCELLED)  # what resume reruns
FAILED_TRIALS = (TrialState.FAILED, TrialState.LOST)  # counted against max_failed


@dataclass
class TrialResult:
    index: int
    params: dict[str, Any]
    state: TrialState
    task_key: str | None = None
    metric: float | None = None
    wall_s: float | None = None
    message: str = ""
    unranked_metric: str | None = None  # a NaN or infinite metric, as text ("nan", "inf")

    @property
    def ranked(self) -> bool:
        return self.metric is not None and math.isfinite(self.metric)

    @property
    def shown_metric(self) -> str:
        if self.metric is not None:
            return f"{self.metric:g}"
        return self.unranked_metric or ""


def metric_fields(value: float | None) -> dict[str, Any]:
    """How a trial records the metric it reported: a finite number as ``metric``; NaN or
    infinity as ``unranked_metric`` text with ``metric`` None (strict JSON has neither,
    and they cannot be ranked)."""
    if value is not None and not math.isfinite(value):
        return {"metric": None, "unranked_metric": f"{value:g}"}
    return {"metric": value, "unranked_metric": None}


def sort_results(results: Iterable[TrialResult], mode: str) -> list[TrialResult]:
    """Trials with a finite metric first, best first; then those that reported NaN or
    infinity; then the others; each of the last two in trial order."""
    results = list(results)
    scored = sorted((r for r in results if r.ranked),
                    key=lambda r: (-(r.metric or 0.0) if mode == "max" else r.metric or 0.0,
                                   r.index))
    rest = sorted((r for r in results if not r.ranked),
                  key=lambda r: (r.metric is None and r.unranked_metric is None, r.index))
    return scored + rest


def best(results: Iterable[TrialResult], mode: str) -> TrialResult | None:
    ranked = sort_results(results, mode)
    return ranked[0] if ranked and ranked[0].ranked else None


def unranked_note(results: Iterable[TrialResult], metric_name: str) -> str | None:
    """One line naming the trials whose metric was NaN or infinite, if any."""
    odd = [r for r in results if not r.ranked and (r.metric is not None or r.unranked_metric)]
    if not odd:
        return None
    listed = ", ".join(f"{r.index} ({r.shown_metric})" for r in sorted(odd, key=lambda r: r.index))
    return (f"unranked: trial(s) {listed} reported {metric_name} as NaN or infinity: ranked "
            f"last; check the training for divergence")


def _param_names(results: Sequence[TrialResult]) -> list[str]:
    names: list[str] = []
    for result in results:
        names += [n for n in result.params if n not in names]
    return names


def to_csv(results: Sequence[TrialResult], path: Path, mode: str = "max") -> None:
    ranked = sort_results(results, mode)
    names = _param_names(ranked)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["index", *names, "state", "metric", "wall_s", "task_key", "message"])
        for r in ranked:
            writer.writerow([r.index, *(r.params.get(n, "") for n in names), r.state,
                             r.metric if r.ranked else r.shown_metric,
                             "" if r.wall_s is None else r.wall_s, r.task_key or "", r.message])


def to_json(results: Sequence[TrialResult], path: Path, extra: Mapping[str, Any],
            mode: str = "max") -> None:
    winner = best(results, mode)
    trials = [{**asdict(r), **metric_fields(r.metric)} if r.metric is not None
              else asdict(r) for r in sort_results(results, mode)]
    path.write_text(json.dumps({"trials": trials, "best": asdict(winner) if winner else None,
                                **extra}, indent=2))


def render_table(results: Sequence[TrialResult], mode: str, metric_name: str) -> str:
    ranked = sort_results(results, mode)
    names = _param_names(ranked)
    header = ["#", *names, "STATE", metric_name.upper(), "WALL(s)", "TASK KEY"]
    rows = [[str(r.index), *(str(r.params.get(n, "")) for n in names), r.state,
             r.shown_metric,
             "" if r.wall_s is None else f"{r.wall_s:.1f}", r.task_key or ""] for r in ranked]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
             .rstrip() for row in [header, *rows]]
    note = unranked_note(results, metric_name)
    if note:
        lines.append(note)
    winner = best(results, mode)
    if winner is None:
        lines.append("best: none (no trial reported a metric)")
    else:
        label = ",".join(f"{k}={v}" for k, v in winner.params.items())
        lines.append(f"best: trial {winner.index} ({label}): {metric_name}={winner.metric:g}")
    return "\n".join(lines)


def read_metrics(text: str, metric: str | None) -> float | None:
    """The metric from the trial's metrics file; None when it wrote none or nothing usable
    (a trial without metrics is finished with no metric, not a crash of the sweep). NaN
    and infinity (``NaN``, ``Infinity`` in the file, as Python's json writes them) come
    back as such: record them with ``metric_fields``."""
    try:
        payload = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None
    if not isinstance(payload, dict):
        return None
    if metric is None:
        numbers = [v for v in payload.values()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return float(numbers[0]) if len(numbers) == 1 else None
    value = payload.get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)

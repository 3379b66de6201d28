"""``hypertf sweep``: a series of trials of one script, each an ordinary job through the queue.

A sweep lives in ``runs/sweeps/<id>/`` on the machine that started it: ``sweep.json`` (the
train request every trial runs, as JSON; the trials, their states and task keys: the
driver's only state), ``results.csv`` and ``results.json`` (the table, best first), and per
trial its request (``trial-<n>.request.json``) and its launcher's log (``trial-<n>.log``).

**Exactly once.** A trial's task key is chosen and saved in ``sweep.json`` *before* its
launcher starts (``python -m hypertf.launch.detach INVENTORY REQUEST KEY``): a driver that
dies between the two leaves a key without a job, which ``resume`` sees as ``lost`` and runs
again under a new key; a key is never started twice. ``resume`` re-runs only failed, lost and
cancelled trials.

**Secrets.** ``sweep.json`` and every trial's request hold ``--env`` *names* only (the sweep's
folder is 0700, its files 0600). The values live in the driver's memory: it hands them to
each trial's launcher on its stdin (as ``hypertf train --detach`` does), a detached driver
gets them on its own stdin, and ``resume`` takes them from its environment again (``--env
NAME`` semantics: NAME must be set there).

Trials are ordinary queued jobs (priorities, per-user limits, owner-only cancel, draining
all apply); the driver keeps at most ``max_concurrent`` launchers alive and stops starting
new trials after ``max_failed`` failures. A trial reports its metric by writing JSON to
``HYPERTF_METRICS_FILE`` (the chief, else worker 0); its launcher copies the file back.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from hypertf.core.errors import Cancelled, UsageError
from hypertf.core.jobrecord import JobState, JobSummary
from hypertf.core.placement import new_task_key
from hypertf.core.rundir import RunDir, make_private, write_private
from hypertf.launch.detach import ENV_ON_STDIN, hand_env
from hypertf.launch.request import TrainRequest
from hypertf.node import procs
from hypertf.store import credentials
from hypertf.sweep import board as sweepboard
from hypertf.sweep.spec import (
    FAILED_TRIALS,
    LIVE_TRIALS,
    RERUN_TRIALS,
    TrialResult,
    TrialState,
    metric_fields,
    read_metrics,
    render_table,
    to_csv,
    to_json,
)

SWEEPS = Path("runs") / "sweeps"
POLL_S = 0.1  # a trial that ended is reaped and the next one started within this


def sweep_dir(sweep_id: str) -> Path:
    if not sweep_id or "/" in sweep_id or sweep_id.startswith("."):
        raise UsageError(f"{sweep_id!r} is not a sweep id (list them with 'hypertf sweep list')")
    return SWEEPS / sweep_id


def alive(pid: int | None) -> bool:
    """The driver's process lives (hypertf.node.procs.alive: one answer for zombies and for
    another user's process everywhere)."""
    return pid is not None and pid > 0 and procs.alive(pid)


@dataclass
class Sweep:
    """What ``sweep.json`` holds; saved atomically after every change."""

    sweep_id: str
    inventory: str
    request: dict[str, Any]  # the TrainRequest every trial runs (JSON, --env names only)
    trials: list[dict[str, Any]]
    metric: str | None = None
    mode: str = "max"
    max_concurrent: int = 2
    max_failed: int | None = None
    created: float = field(default_factory=time.time)
    driver_pid: int | None = None

    @property
    def dir(self) -> Path:
        return sweep_dir(self.sweep_id)

    def save(self) -> None:
        make_private(self.dir)
        temporary = self.dir / "sweep.json.tmp"
        write_private(temporary, json.dumps(self.__dict__, indent=2))
        os.replace(temporary, self.dir / "sweep.json")

    def env_values(self) -> dict[str, str]:
        """The trials' --env values, read from this process's environment by the names the
        sweep saved (a missing one is a usage error naming it): what ``resume`` hands on."""
        request = TrainRequest.from_json(self.request)
        try:
            return request.env_vars()
        except UsageError as err:
            raise UsageError(f"sweep {self.sweep_id}: {err} (its trials take their --env "
                             f"values from the environment of 'hypertf sweep resume')") from err

    @classmethod
    def load(cls, sweep_id: str) -> Sweep:
        path = sweep_dir(sweep_id) / "sweep.json"
        if not path.is_file():
            raise UsageError(f"no sweep {sweep_id!r} under {SWEEPS}/ (list them with 'hypertf "
                             f"sweep list', from the directory the sweep was started in)")
        fields = json.loads(path.read_text())
        if "train_argv" in fields:
            raise UsageError(f"sweep {sweep_id} was saved by an older HyperTF (a command line, "
                             f"not a request): start it again with 'hypertf sweep'")
        return cls(**fields)

    @property
    def cancel_marker(self) -> Path:
        return self.dir / "cancel"

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for trial in self.trials:
            counts[trial["state"]] = counts.get(trial["state"], 0) + 1
        return counts

    def results(self) -> list[TrialResult]:
        return [TrialResult(index=t["index"], params=t["params"], state=t["state"],
                            task_key=t.get("task_key"), metric=t.get("metric"),
                            wall_s=t.get("wall_s"), message=t.get("message", ""),
                            unranked_metric=t.get("unranked_metric"))
                for t in self.trials]

    def write_results(self) -> None:
        results = self.results()
        to_csv(results, self.dir / "results.csv", self.mode)
        to_json(results, self.dir / "results.json", {
            "sweep": self.sweep_id, "metric": self.metric, "mode": self.mode,
            "counts": self.counts()}, self.mode)

    def table(self) -> str:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(self.counts().items()))
        return (f"sweep {self.sweep_id}: {len(self.trials)} trials ({counts})\n"
                + render_table(self.results(), self.mode, self.metric or "metric"))


def create(inventory: str, request: TrainRequest, trials: Sequence[Any],
           metric: str | None, mode: str, max_concurrent: int,
           max_failed: int | None) -> Sweep:
    """A new sweep with every trial ``pending`` (expanded once, saved before anything runs)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    sweep = Sweep(f"sweep-{stamp}-{secrets.token_hex(3)}", str(inventory),
                  request.without_env_values().to_json(),
                  [{"index": t.index, "params": dict(t.params), "args": t.args(),
                    "label": t.label(), "state": TrialState.PENDING, "tries": 0} for t in trials],
                  metric, mode, max_concurrent, max_failed)
    sweep.save()
    return sweep


# -- the driver ---------------------------------------------------------------------------
class Driver:
    """Start trials up to ``max_concurrent``, reap them, record each result."""

    def __init__(self, sweep: Sweep, env: Mapping[str, str], say: Any = print) -> None:
        self.sweep = sweep
        self.env = dict(env)  # the --env values: in memory only, handed to each launcher
        self.say = say
        self.running: dict[int, subprocess.Popen[bytes]] = {}

    def trial_request(self, trial: dict[str, Any]) -> TrainRequest:
        """The sweep's request with the trial's hyperparameters after the script's arguments."""
        request = TrainRequest.from_json(self.sweep.request)
        return replace(request, args=(*request.args, *trial["args"]))

    def trial_argv(self, trial: dict[str, Any], key: str) -> list[str]:
        """A launcher of its own for the trial, from its request file (as a detached job's:
        --env names in the file, the values on its stdin)."""
        path = self.sweep.dir / f"trial-{trial['index']}.request.json"
        write_private(path, json.dumps(self.trial_request(trial).to_json()))
        return [sys.executable, "-m", "hypertf.launch.detach", self.sweep.inventory, str(path),
                key, ENV_ON_STDIN]

    def start(self, trial: dict[str, Any]) -> None:
        key = new_task_key(credentials.job_owner())
        trial.update(state=TrialState.QUEUED, task_key=key, tries=trial.get("tries", 0) + 1,
                     started=time.time(), metric=None, unranked_metric=None, wall_s=None,
                     message="")
        self.sweep.save()  # the key is recorded before the job can exist: never two jobs
        fd = os.open(self.sweep.dir / f"trial-{trial['index']}.log",
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as log:
            launcher = subprocess.Popen(self.trial_argv(trial, key), stdin=subprocess.PIPE,
                                        stdout=log, stderr=subprocess.STDOUT)
        hand_env(launcher, self.env)
        trial["launcher_pid"] = launcher.pid
        trial["state"] = TrialState.RUNNING
        self.running[trial["index"]] = launcher
        self.sweep.save()
        self.say(f"hypertf: sweep {self.sweep.sweep_id}: trial {trial['index']} "
                 f"({trial['label']}) as job {key}")

    def finish(self, trial: dict[str, Any], code: int) -> None:
        """The trial's state, metric and wall time from its launcher's exit and files."""
        log = (self.sweep.dir / f"trial-{trial['index']}.log").read_text(errors="replace")
        summary = find_summary(trial["task_key"])
        if code == 0:
            state = TrialState.SUCCEEDED
        elif code in (Cancelled.exit_code, 130, -signal.SIGINT):  # cancel/kill, or Ctrl-C
            # (-SIGINT: a launcher still among its imports died of the Ctrl-C itself)
            state = TrialState.CANCELLED
        elif code < 0 or (summary is not None and summary.get("result") == JobState.LOST):
            state = TrialState.LOST  # the launcher was killed outright
        else:
            state = TrialState.FAILED
        lines = [line for line in log.splitlines() if line.startswith("hypertf: error")]
        metrics = find_metrics(summary) if summary else None
        reported = read_metrics(metrics, self.sweep.metric) if metrics is not None else None
        failure = lines[-1][16:200] if lines and state != TrialState.SUCCEEDED else ""
        trial.update(state=state, message=failure, **metric_fields(reported), ended=time.time())
        trial["wall_s"] = round(trial["ended"] - trial.get("started", trial["ended"]), 2)
        self.sweep.save()
        self.sweep.write_results()
        try:
            sweepboard.record_trial(self.sweep.dir, self.sweep.metric, self.sweep.trials, trial)
        except Exception as err:  # the TensorBoard view is a by-product: the sweep goes on
            self.say(f"hypertf: sweep {self.sweep.sweep_id}: trial {trial['index']} not written "
                     f"for TensorBoard ({type(err).__name__}: {err}); results.csv has it")
        name = self.sweep.metric or "metric"
        shown = f", {name}={trial['metric']}" if trial["metric"] is not None else ""
        if trial.get("unranked_metric"):
            shown = f", {name}={trial['unranked_metric']} (not a finite number: ranked last)"
        self.say(f"hypertf: sweep {self.sweep.sweep_id}: trial {trial['index']} "
                 f"({trial['label']}) {state}{shown}")

    def reap(self) -> None:
        for index, launcher in list(self.running.items()):
            code = launcher.poll()
            if code is not None:
                del self.running[index]
                self.finish(self.sweep.trials[index], code)

    def stop_starting(self) -> str | None:
        """Why no new trial may start (cancelled, too many failures), if so."""
        if self.sweep.cancel_marker.exists():
            return "the sweep was cancelled"
        failed = sum(t["state"] in FAILED_TRIALS for t in self.sweep.trials)
        limit = self.sweep.max_failed
        if limit is not None and failed > limit:
            return f"{failed} trials failed, more than max_failed={limit}"
        return None

    def run(self) -> int:
        self.sweep.driver_pid = os.getpid()
        self.sweep.save()
        try:
            while True:
                self.reap()
                pending = [t for t in self.sweep.trials if t["state"] == TrialState.PENDING]
                why = self.stop_starting()
                if why and pending:
                    for trial in pending:
                        trial.update(state=TrialState.CANCELLED, message=f"not started: {why}")
                    self.sweep.save()
                    self.say(f"hypertf: sweep {self.sweep.sweep_id}: {why}: "
                             f"{len(pending)} trials not started")
                    pending = []
                while pending and len(self.running) < self.sweep.max_concurrent:
                    self.start(pending.pop(0))
                if not self.running and not pending:
                    break
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            for launcher in self.running.values():  # they got the same SIGINT: let them
                with contextlib.suppress(subprocess.TimeoutExpired):  # stop and release
                    launcher.wait(timeout=120)
            self.reap()
            raise
        finally:
            self.sweep.driver_pid = None
            self.sweep.save()
            self.sweep.write_results()
        print(self.sweep.table(), flush=True)
        counts = self.sweep.counts()
        return 0 if counts.get(TrialState.SUCCEEDED, 0) == len(self.sweep.trials) else 1


def find_summary(task_key: str) -> JobSummary | None:
    """The summary of the trial's last attempt (restarts and port retries get new keys):
    summary.json as the trial's launcher wrote it."""
    direct = Path(RunDir.of(".", task_key, local=True).summary)
    candidates = [direct] if direct.is_file() else sorted(Path("runs").glob("*/summary.json"))
    for path in candidates:
        with contextlib.suppress(OSError, ValueError):
            summary = json.loads(path.read_text())
            attempts = summary.get("attempts") or [{"task_key": summary.get("task_key")}]
            if attempts[0].get("task_key") == task_key:
                return cast(JobSummary, summary)
    return None


def find_metrics(summary: JobSummary) -> str | None:
    path = Path(RunDir.of(".", summary["task_key"], local=True).metrics)
    return path.read_text(errors="replace") if path.is_file() else None


# -- resume, cancel, list ------------------------------------------------------------------
def settle_orphans(sweep: Sweep) -> None:
    """Trials left queued/running by a driver that died: finished ones take their result,
    the others (no launcher any more) are lost."""
    for trial in sweep.trials:
        if trial["state"] not in LIVE_TRIALS:
            continue
        if alive(trial.get("launcher_pid")):
            raise UsageError(f"trial {trial['index']} of {sweep.sweep_id} still runs (launcher "
                             f"PID {trial['launcher_pid']}): wait for it, or 'hypertf sweep "
                             f"cancel {sweep.sweep_id}'")
        summary = find_summary(trial["task_key"]) if trial.get("task_key") else None
        if summary and summary.get("result") == JobState.SUCCEEDED:
            metrics = find_metrics(summary)
            trial.update(state=TrialState.SUCCEEDED, wall_s=summary.get("wall_s"),
                         **metric_fields(read_metrics(metrics, sweep.metric)
                                         if metrics else None))
        else:
            trial.update(state=TrialState.LOST,
                         message="its launcher went away with the sweep's driver")
    sweep.save()


def resume(sweep_id: str) -> Sweep:
    """Failed, lost and cancelled trials back to pending (new keys when they start)."""
    sweep = Sweep.load(sweep_id)
    if alive(sweep.driver_pid):
        raise UsageError(f"sweep {sweep_id} is still running (driver PID {sweep.driver_pid})")
    settle_orphans(sweep)
    sweep.cancel_marker.unlink(missing_ok=True)
    rerun = [t for t in sweep.trials if t["state"] in RERUN_TRIALS]
    for trial in rerun:
        trial.update(state=TrialState.PENDING, message="")
    sweep.save()
    return sweep


def cancel(sweep_id: str, kill_job: Any) -> list[str]:
    """Stop starting trials and end the waiting and running ones (``kill_job(key)``)."""
    sweep = Sweep.load(sweep_id)
    sweep.cancel_marker.touch()
    ended = []
    for trial in sweep.trials:
        if trial["state"] in LIVE_TRIALS and trial.get("task_key") and kill_job(trial["task_key"]):
            ended.append(trial["task_key"])
    if not alive(sweep.driver_pid):  # no driver to record it: do it here
        for trial in sweep.trials:
            if trial["state"] in (*LIVE_TRIALS, TrialState.PENDING):
                trial.update(state=TrialState.CANCELLED, message="the sweep was cancelled")
        sweep.save()
        sweep.write_results()
    return ended


def list_sweeps(inventory: str | Path | None = None) -> list[Sweep]:
    """The sweeps under runs/sweeps, newest first; with ``inventory``, only those whose
    trials run on it (the same file, however it was spelt): another cluster's sweeps are
    not this one's."""
    found = []
    for path in sorted(SWEEPS.glob("*/sweep.json"), reverse=True):
        with contextlib.suppress(OSError, ValueError, TypeError):
            found.append(Sweep(**json.loads(path.read_text())))
    if inventory is None:
        return found
    return [sweep for sweep in found if same_file(sweep.inventory, inventory)]


def same_file(one: str | Path, other: str | Path) -> bool:
    """Two spellings of one path (relative ones from here, where the sweeps are)."""
    return os.path.realpath(one) == os.path.realpath(other)


def detach(sweep: Sweep, env: Mapping[str, str]) -> int:
    """The driver in a session of its own (survives logout); its output in sweep.log, the
    --env values on its stdin (never on its command line nor in a file)."""
    fd = os.open(sweep.dir / "sweep.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as log:
        driver = subprocess.Popen([sys.executable, "-m", "hypertf.sweep.driver", sweep.sweep_id,
                                   ENV_ON_STDIN], stdin=subprocess.PIPE, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    hand_env(driver, dict(env))
    print(sweep.sweep_id)
    print(f"hypertf: sweep {sweep.sweep_id} detached (driver PID {driver.pid}, output "
          f"{sweep.dir / 'sweep.log'}); see 'hypertf sweep status {sweep.sweep_id}', end "
          f"with 'hypertf sweep cancel {sweep.sweep_id}'", file=sys.stderr)
    return 0


if __name__ == "__main__":  # the detached driver: python -m hypertf.sweep.driver ID --env-on-stdin
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from hypertf.launch.detach import env_from_stdin
    from hypertf.launch.exits import run

    values = env_from_stdin() if ENV_ON_STDIN in sys.argv[2:] else {}
    sys.exit(run(lambda: Driver(Sweep.load(sys.argv[1]), values, say=lambda line: print(
        line, flush=True)).run()))

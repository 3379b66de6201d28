"""The ``hypertf sweep`` command line (and ``invoke sweep``'s): run, status, resume, cancel, list.

``hypertf sweep [train options] --grid lr=0.1,0.01 --grid batch_size=32,64 [-- args]`` or
``hypertf sweep SPEC.yml``; every train option (``--worker``, ``--priority``, ``--env``...) is
passed to each trial as written, and each trial appends its own ``--name value`` arguments.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from hypertf.cli.trainargs import INVENTORY_HELP, parse_train, train_request
from hypertf.core.errors import UsageError
from hypertf.launch.request import TRAIN_OPTIONS
from hypertf.sweep import driver as sweeps
from hypertf.sweep.spec import SweepSpec, TrialState, expand, load_spec, parse_grid_option

VERBS = ("status", "resume", "cancel", "list")

USAGE = """hypertf sweep [-i INVENTORY] --script PATH [train options] --grid NAME=V1,V2 ...
                     [sweep options] [-- script arguments]
       hypertf sweep [-i INVENTORY] [sweep options] SPEC.yml
       hypertf sweep {status,resume,cancel} SWEEP_ID | hypertf sweep list"""

DESCRIPTION = """Trials of one script over a grid (--grid, repeatable: every combination) or,
from a spec file, a grid or a random search. Each trial is a queued 'hypertf train' job
with the train options below; its own '--NAME value' arguments follow the script's.

  hypertf sweep --script train.py --worker 2 --grid lr=0.1,0.01 --grid batch_size=32,64 \\
      --metric accuracy -- --epochs 3
  hypertf sweep sweep.yml                   (script, train, grid or random, metric: README, sweeps)

then: hypertf sweep status SWEEP_ID (the trials' table), hypertf sweep resume SWEEP_ID (re-run
the failed, lost and cancelled trials), hypertf sweep cancel SWEEP_ID, hypertf sweep list."""


def _sweep_options(parser: argparse.ArgumentParser, default_inventory: str) -> None:
    parser.add_argument("-i", "--inventory", default=default_inventory, help=INVENTORY_HELP)
    parser.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                        help="a hyperparameter and its values (repeatable: the product)")
    parser.add_argument("--max-concurrent", type=int, default=None,
                        help="trials at once (default 2; each still waits in the queue)")
    parser.add_argument("--max-failed", type=int, default=None,
                        help="stop starting trials after more failures than this")
    parser.add_argument("--metric", help="the key of HYPERTF_METRICS_FILE's JSON to rank by")
    parser.add_argument("--mode", choices=("max", "min"), default=None,
                        help="higher (max, default) or lower (min) is better")
    parser.add_argument("--detach", action="store_true",
                        help="print the sweep id and return; the sweep goes on in background")


def help_parser(default_inventory: str) -> argparse.ArgumentParser:
    """The parser ``hypertf sweep -h`` prints: how to run a sweep, its own options and every
    train option a trial takes (the run itself parses those with ``parse_train``)."""
    parser = argparse.ArgumentParser(prog="hypertf sweep", usage=USAGE, description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    _sweep_options(parser, default_inventory)
    trial = parser.add_argument_group("train options (passed to every trial)")
    for option in TRIAL_OPTIONS:
        if option.kind is bool:
            trial.add_argument(option.flag, action="store_true", help=option.help)
        else:
            trial.add_argument(option.flag, metavar=option.metavar, help=option.help)
    return parser


TRIAL_OPTIONS = tuple(option for option in TRAIN_OPTIONS if option.name != "detach")
"""The train options a sweep passes to every trial (its --detach is the sweep's own)."""


def train_argv_of(spec: SweepSpec) -> list[str]:
    """A YAML spec's ``train`` mapping as ``hypertf train`` options (names checked)."""
    options = {option.name: option for option in TRIAL_OPTIONS if option.name != "script"}
    argv = ["--script", spec.script]
    script_args: list[str] = []
    for key, value in spec.train.items():
        if key == "args":
            script_args = [str(item) for item in value]
            continue
        option = options.get(key)
        if option is None:
            raise UsageError(f"sweep spec: train option {key!r} is unknown; use one of "
                             f"{', '.join(sorted(options))}, args")
        argv += option_args(option.flag, value)
    return [*argv, "--", *script_args] if script_args else argv


def run(argv: Sequence[str], default_inventory: str) -> int:
    """``hypertf sweep ...``: create the sweep, then drive it here or detached."""
    argv = list(argv)
    if argv[:1] and argv[0] in VERBS:
        return _verb(argv, default_inventory)
    cut = argv.index("--") if "--" in argv else len(argv)
    before, after = argv[:cut], argv[cut + 1:]
    if "-h" in before or "--help" in before:
        help_parser(default_inventory).print_help()
        return 0
    parser = argparse.ArgumentParser(prog="hypertf sweep", allow_abbrev=False)
    _sweep_options(parser, default_inventory)
    known, rest = parser.parse_known_args(before)
    if rest[:1] and rest[0].endswith((".yml", ".yaml")) and not rest[0].startswith("-"):
        spec = load_spec(rest[0])
        if rest[1:] or after or known.grid:
            raise UsageError("a sweep from a spec file takes its options from the file; only "
                             "-i, --detach, --max-concurrent, --max-failed, --metric and "
                             "--mode may be given beside it")
        request = train_request(parse_train(train_argv_of(spec)))
    else:
        parsed = parse_train([*rest, "--", *after])  # --script and the options, checked
        spec = SweepSpec(script=parsed.script, train={}, grid=parse_grid_option(known.grid))
        request = train_request(parsed)
    request.validate()
    env = request.env_vars()  # --env NAME read here (unset: a usage error before anything)
    trials = expand(spec)
    if not trials:
        raise UsageError("a sweep needs --grid NAME=V1,V2 (or a spec file with grid/random)")
    sweep = sweeps.create(
        known.inventory, request, trials, known.metric or spec.metric,
        known.mode or spec.mode or "max",
        known.max_concurrent or spec.max_concurrent,
        known.max_failed if known.max_failed is not None else spec.max_failed)
    print(f"hypertf: sweep {sweep.sweep_id}: {len(trials)} trials, at most "
          f"{sweep.max_concurrent} at once; state in {sweep.dir}/", flush=True)
    if known.detach:
        return sweeps.detach(sweep, env)
    return sweeps.Driver(sweep, env, say=lambda line: print(line, flush=True)).run()


VERB_HELP = {
    "status": "the sweep's trials: state, parameters, metric (and where its results are)",
    "resume": "re-run the sweep's failed, lost and cancelled trials",
    "cancel": "end the sweep: its waiting and running trials are cancelled or killed",
    "list": "the sweeps started from this directory (runs/sweeps/), of one inventory or all",
}


def _verb(argv: list[str], default_inventory: str) -> int:
    parser = argparse.ArgumentParser(prog=f"hypertf sweep {argv[0]}", allow_abbrev=False,
                                     description=VERB_HELP[argv[0]])
    if argv[0] == "list":  # local files: without -i, every inventory's, each named
        parser.add_argument("-i", "--inventory", default=None,
                            help="only the sweeps of this inventory (default: every one's)")
    else:
        parser.add_argument("-i", "--inventory", default=default_inventory,
                            help=INVENTORY_HELP)
    if argv[0] != "list":
        parser.add_argument("sweep_id", metavar="SWEEP_ID",
                            help="the sweep's id (hypertf sweep list)")
    if argv[0] == "resume":
        parser.add_argument("--detach", action="store_true",
                            help="print the sweep id and return; the sweep goes on in "
                                 "background")
    args = parser.parse_args(argv[1:])
    actions: dict[str, Callable[[], int]] = {
        "status": lambda: _status(args.sweep_id),
        "list": lambda: _list(args.inventory),
        "cancel": lambda: _cancel(args.sweep_id),
        "resume": lambda: _resume(args.sweep_id, bool(getattr(args, "detach", False))),
    }
    return actions[argv[0]]()


def _status(sweep_id: str) -> int:
    sweep = sweeps.Sweep.load(sweep_id)
    driver = f"driver PID {sweep.driver_pid}" if sweeps.alive(sweep.driver_pid) else \
        "no driver running"
    print(f"{sweep.table()}\n({driver}; results: {sweep.dir}/results.csv, results.json)")
    return 0


def _list(inventory: str | None) -> int:
    """The sweeps of ``inventory`` (those of others are counted, not listed); without one,
    every sweep with its inventory named."""
    found = sweeps.list_sweeps(inventory)
    others = len(sweeps.list_sweeps()) - len(found)
    if not found:
        print(f"no sweeps{f' of {inventory}' if inventory else ''} under {sweeps.SWEEPS}/")
    for sweep in found:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(sweep.counts().items()))
        running = "running" if sweeps.alive(sweep.driver_pid) else "idle"
        print(f"{sweep.sweep_id}  {running:<7}  {len(sweep.trials)} trials: {counts}"
              + ("" if inventory else f"  (on {sweep.inventory})"))
    if others:
        print(f"({others} sweeps of other inventories not shown: hypertf sweep list -i "
              f"INVENTORY)")
    return 0


def _cancel(sweep_id: str) -> int:
    """End the sweep's trials on the cluster they run on: its own inventory's, whatever -i
    says (another cluster has none of its jobs)."""
    from hypertf import store
    from hypertf.config.inventory import load_inventory

    inventory = sweeps.Sweep.load(sweep_id).inventory
    with store.opened(load_inventory(inventory).cluster) as zk:
        ended = sweeps.cancel(sweep_id, lambda key: zk.matrix.kill(key, "hypertf sweep cancel"))
    print(f"sweep {sweep_id}: cancelled; {len(ended)} waiting or running trials ended"
          + (f" ({', '.join(ended)})" if ended else ""))
    return 0


def _resume(sweep_id: str, detach: bool) -> int:
    sweep = sweeps.resume(sweep_id)
    env = sweep.env_values()
    again = sum(t["state"] == TrialState.PENDING for t in sweep.trials)
    print(f"hypertf: sweep {sweep_id}: re-running {again} failed, lost or cancelled trials",
          flush=True)
    if detach:
        return sweeps.detach(sweep, env)
    return sweeps.Driver(sweep, env, say=lambda line: print(line, flush=True)).run()


def invoke_args(**options: Any) -> list[str]:
    """``invoke sweep`` keyword arguments as this command line."""
    return [part for key, value in options.items() if value not in (None, "")
            for part in option_args(f"--{key.replace('_', '-')}", value)]


def option_args(flag: str, value: Any) -> list[str]:
    """One option as argv: a flag for True, nothing for False, repeated for a list."""
    if isinstance(value, bool):
        return [flag] if value else []
    if isinstance(value, list):
        return [part for item in value for part in (flag, str(item))]
    return [flag, str(value)]

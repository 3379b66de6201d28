"""Invoke tasks: ``invoke --list``. Each task calls the same typed functions as the
``hypertf`` command (hypertf.cli.commands and the other verb modules beside it: authverbs,
clusterverbs, labverbs), with typed values: no command line in between.

The tasks of hypertf's verbs are made from the verb table (hypertf.cli.options.VERB_OPTIONS)
and hypertf's own tree, one line each in ``VERB_TASKS``; ``train``, ``export`` and ``sweep``
are written out over TRAIN_OPTIONS (the script's arguments after ``--``), ``test`` and
``bench`` are the repository's."""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import invoke
from invoke import Collection, Context, Exit, Task

from hypertf.cli import commands, trainargs
from hypertf.cli import main as cli
from hypertf.cli import sweep as sweepcli
from hypertf.cli.options import VERB_OPTIONS, command_args
from hypertf.cli.sweep import TRIAL_OPTIONS
from hypertf.export.targets import EXPORT_OPTIONS, TRAIN_ONLY
from hypertf.launch.exits import quiet_uncaught_broken_pipe
from hypertf.launch.request import TRAIN_OPTIONS, Option, TrainRequest

quiet_uncaught_broken_pipe()  # invoke --help train | head -1: no traceback

INVENTORY_HELP = {"inventory": trainargs.INVENTORY_HELP}


class TypedTask(Task):
    """Invoke's Task, typed by the body's annotations: Invoke guesses an option's type from
    its default, so ``timeout: float | None = None`` would arrive as text. Its automatic
    short flags never take ``-h`` (help) nor a non-letter (``--, --idle-fail``); ``-i`` is
    always the inventory."""

    def arg_opts(self, name: str, default: Any, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, {*taken_names, "h"})
        opts["names"] = [n for n in opts["names"] if len(n) > 1 or n.isalpha()]
        kind = option_kind(self.body, name)
        if kind in (int, float, str) and not opts["positional"]:
            opts["kind"] = kind
        if name == "inventory" and "i" not in {*opts["names"], *taken_names}:
            opts["names"].append("i")
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Any]:
        """Invoke's, keeping the help: its ``arg_opts`` pops each text from ``self.help``, so
        a second call (a test reading the help) found none."""
        help = dict(self.help)
        try:
            return super().get_arguments(ignore_unknown_help)
        finally:
            self.help = help


def option_kind(body: Callable[..., Any], name: str) -> type | None:
    """The type an option's annotation names, ``None`` taken away (``int | None``: int)."""
    hint = typing.get_type_hints(body).get(name)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds = [kind for kind in typing.get_args(hint) if kind is not type(None)]
        hint = kinds[0] if len(kinds) == 1 else None
    return hint if isinstance(hint, type) else None


task = functools.partial(invoke.task, klass=TypedTask)


Body = Callable[..., None]


def with_options(options: tuple[Option, ...]) -> Callable[[Body], Body]:
    """Give a ``(c, **values)`` body one keyword parameter per option (name, default and
    annotation from the table), so Invoke sees them as if written out by hand."""

    def decorate(body: Body) -> Body:
        signature = inspect.signature(body)
        fixed = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        added = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default,
                                   annotation=_annotation(o)) for o in options]
        body.__signature__ = signature.replace(parameters=[*fixed, *added])  # type: ignore[attr-defined]
        body.__annotations__ = {**typing.get_type_hints(body),
                                **{o.name: _annotation(o) for o in options}}
        return body

    return decorate


def _annotation(option: Option) -> Any:
    if option.kind is list:
        return list[str] | None
    return option.kind if option.default is not None else option.kind | None


def option_help(options: tuple[Option, ...]) -> dict[str, str]:
    return {option.name: option.help for option in options}


def option_lists(options: tuple[Option, ...]) -> list[str]:
    return [option.name for option in options if option.kind is list]


def _call(func: Callable[..., int], **kwargs: object) -> None:
    """Run a hypertf verb; a failure becomes invoke.Exit with its message's exit code."""
    cli.quiet_kazoo()
    code = cli.run(lambda: func(**kwargs))
    if code == cli.SIGPIPE_EXIT:  # the reader left (| head): no Invoke message either
        sys.exit(code)
    if code:
        raise Exit(code=code)


def _inv(inventory: str | None) -> str:
    return inventory or cli.default_inventory()


@dataclass(frozen=True)
class VerbTask:
    """An Invoke task of a ``hypertf`` verb: its dotted name (``zk.start``), hypertf's words
    (``zk start``: the verb's and its action's) and the task's one line for ``invoke --list``.
    All else comes from the verb itself: its options (VERB_OPTIONS), whether it takes
    ``-i/--inventory`` and with what help, and the function it runs (hypertf's tree)."""

    name: str
    words: str
    doc: str


VERB_TASKS = (
    VerbTask("zk.start", "zk start", "Start the local standalone ZooKeeper the inventory names."),
    VerbTask("zk.stop", "zk stop", "Stop the local ZooKeeper (by its pidfile)."),
    VerbTask("zk.status", "zk status",
             "Say whether the local ZooKeeper serves, and in which mode."),
    VerbTask("agent.start", "agents start",
             "Start the resource agent on the nodes (over SSH; locally for a local node)."),
    VerbTask("agent.stop", "agents stop",
             "Stop the resource agent on the nodes; their records leave ZooKeeper at once."),
    VerbTask("jobs", "jobs",
             "List recent jobs, newest first: running, succeeded, failed, interrupted, killed."),
    VerbTask("kill", "kill",
             "Stop a running job from anywhere: its tasks stop and its GPUs return."),
    VerbTask("cancel", "cancel", "End a waiting or running job (yours; the admin: any)."),
    VerbTask("hold", "hold", "Keep a waiting job in the queue without admitting it."),
    VerbTask("unhold", "unhold", "Let a held job be admitted again."),
    VerbTask("queue", "queue",
             "Waiting jobs in admission order: position, priority, waiting time, reason."),
    VerbTask("usage", "usage",
             "GPU-hours per user, day or GPU model from the keeper's ledger."),
    VerbTask("dashboard", "dashboard",
             "Serve a read-only web page of the matrix, the queue, jobs, logs and sweeps."),
    VerbTask("logs", "logs", "A job's task logs, read on the nodes (running or finished jobs)."),
    VerbTask("cluster.status", "status",
             "Show hosts x GPUs (free / busy / unavailable), agents and ZooKeeper health."),
    VerbTask("cluster.setup", "cluster setup",
             "Provision every node with deploy.yml (SSH keys, virtualenv, ZooKeeper, agents)."),
    VerbTask("cluster.teardown", "cluster teardown",
             "Stop the agents (and ZooKeeper on request) and remove what cluster.setup "
             "installed."),
    VerbTask("auth.init", "auth init",
             "As the admin: make the cluster's ZooKeeper credentials and secure its root."),
    VerbTask("auth.add-user", "auth add-user",
             "As the admin: register a user and write the credential file to hand them."),
    VerbTask("auth.accounts", "auth accounts",
             "As the admin: each user's node account (name, uid, SSH key) as registered."),
    VerbTask("auth.limits", "auth limits",
             "As the admin: a user's maximum priority, GPU limit, share, budget, exemption."),
    VerbTask("auth.footprint", "auth footprint",
             "As the admin: each user's znodes, bytes and junk names; delete one user's junk."),
    VerbTask("lab.up", "lab up",
             "Create a multi-host lab on this machine; the last line printed is its inventory."),
    VerbTask("lab.down", "lab down",
             "Remove the lab(s): hosts, sshd, agents, ZooKeeper, namespaces, bridge, files."),
    VerbTask("lab.list", "lab list", "List the labs that are up."),
)
"""Every task that is a ``hypertf`` verb with VERB_OPTIONS (train, export and sweep have
TRAIN_OPTIONS and their own tasks below; test and bench are the repository's)."""


def verb_task(spec: VerbTask, root: argparse.ArgumentParser) -> Task:
    """The task of one hypertf verb: the verb's options (VERB_OPTIONS by its words, the
    action aside), ``-i/--inventory`` when the verb has it (with its help), and a body that
    calls the function the verb runs with what ``hypertf WORDS`` would give it
    (cli.verb_call: the command word, the action word, the typed option values)."""
    parser, action = cli.verb_parser(root, spec.words)
    words = spec.words.split()
    options = VERB_OPTIONS[" ".join(words[:len(words) - len(action)])]
    inventory_help = {a.dest: a.help for a in parser._actions if a.dest == "inventory"}
    fixed = {"command": words[0], "func": parser.get_default("func"),
             **({"action": words[1]} if len(words) > 1 else {})}

    def run(chosen: dict[str, Any], values: Mapping[str, Any]) -> None:
        func, kwargs = cli.verb_call(argparse.Namespace(
            **fixed, **chosen, **command_args(options, values)))
        _call(func, **kwargs)

    def with_inventory(c: Context, inventory: str | None = None, **values: Any) -> None:
        run({"inventory": _inv(inventory)}, values)

    def without_inventory(c: Context, **values: Any) -> None:
        run({}, values)

    body: Body = with_inventory if inventory_help else without_inventory
    body.__doc__ = spec.doc
    body.__name__ = body.__qualname__ = spec.name.replace(".", "_").replace("-", "_")
    return task(positional=[option.name for option in options if option.positional],
                help={**inventory_help, **option_help(options)})(with_options(options)(body))


@task(auto_shortflags=False, iterable=option_lists(TRAIN_OPTIONS), help={**INVENTORY_HELP,
                                                  **option_help(TRAIN_OPTIONS)})
@with_options(TRAIN_OPTIONS)
def train(c: Context, inventory: str | None = None, **options: Any) -> None:
    """Run a distributed TensorFlow job; hyperparameters go after '--'."""
    if not options["script"]:
        raise Exit("invoke train: --script is required (the training script, on the nodes "
                   "or inside --sync DIR)", code=2)
    _call(lambda: commands.train(_inv(inventory), train_request(options),
                                 detach=options["detach"]))


@task(auto_shortflags=False, iterable=option_lists(TRAIN_OPTIONS), help={
    **INVENTORY_HELP, **option_help(TRAIN_OPTIONS), **option_help(EXPORT_OPTIONS),
    **{option.name: "train only: export refuses it" for option in TRAIN_ONLY}})
@with_options(TRAIN_OPTIONS + EXPORT_OPTIONS)
def export(c: Context, inventory: str | None = None, **options: Any) -> None:
    """Write a train command as jobset, volcano, k8s, tfjob, marathon or docker files."""
    from hypertf import export as exporter

    if not options["script"] or not options["to"]:
        raise Exit("invoke export: --to TARGET and --script are required", code=2)
    _call(lambda: exporter.command(_inv(inventory), train_request(options),
                                   exporter.export_options(options), options["output"]))


def train_request(values: Mapping[str, Any]) -> TrainRequest:
    """The request of ``invoke train``'s option values and the script's arguments."""
    return TrainRequest.from_options(values, _script_args())


def _script_args() -> list[str]:
    """What follows '--', from argv: Invoke joins it into one string, losing the quoting."""
    return sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []


@task(auto_shortflags=False, iterable=["grid", *option_lists(TRIAL_OPTIONS)], help={
    **INVENTORY_HELP, **option_help(TRIAL_OPTIONS),
    "script": "training script (or give --spec)",
    "spec": "a sweep spec YAML (grid/random, train options, metric...)",
    "grid": "NAME=V1,V2 (repeatable: every combination is a trial)",
    "max_concurrent": "trials at once (2)", "max_failed": "stop after more failures than this",
    "metric": "the metrics-file key to rank by", "mode": "max (default) or min",
    "detach": "return at once; the sweep goes on in background"})
@with_options(TRIAL_OPTIONS)
def sweep(c: Context, spec: str | None = None, grid: list[str] | None = None,
          max_concurrent: int | None = None, max_failed: int | None = None,
          metric: str | None = None, mode: str | None = None, detach: bool = False,
          inventory: str | None = None, **options: Any) -> None:
    """Run a hyperparameter sweep (each train option is each trial's) through the queue."""
    train = [part for o in TRIAL_OPTIONS if options[o.name] not in (o.default, None, [])
             for part in sweepcli.option_args(o.flag, options[o.name])]
    sweep_options = sweepcli.invoke_args(grid=grid or [], max_concurrent=max_concurrent,
                                         max_failed=max_failed, metric=metric, mode=mode,
                                         detach=detach)
    argv = [*([spec] if spec else []), *train, *sweep_options, "-i", _inv(inventory)]
    hyperparameters = _script_args()
    _call(lambda: sweepcli.run([*argv, *(["--", *hyperparameters] if hyperparameters else [])],
                               _inv(inventory)))


@task(help={"args": "extra pytest arguments, e.g. '-k allocation -x'"})
def test(c: Context, args: str = "") -> None:
    """Run the whole test suite (needs root for the lab)."""
    c.run(f"{sys.executable} -m pytest {args}", pty=False)


BENCHMARKS = ("launch_fanout", "e2e_overhead", "allocation", "scale", "queueing", "sweep",
              "agent_footprint", "failure_detection", "offload", "flood", "confine",
              "preemption")


@task(help={"quick": "small sizes: a smoke run of 10-30 s per benchmark",
            "only": f"comma-separated names (default all: {', '.join(BENCHMARKS)})",
            "out": "directory for the figures as JSON and report.md "
                   "(default runs/bench/<date-time>)"})
def bench(c: Context, quick: bool = False, only: str | None = None, out: str | None = None,
          ) -> None:
    """Run the benchmarks in bench/ (needs root for the lab); each prints figures and command."""
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parent
    names = [n.strip() for n in only.split(",")] if only else list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise Exit(f"unknown benchmark {', '.join(unknown)}; choose from "
                   f"{', '.join(BENCHMARKS)}", code=2)
    results = Path(out or repo / "runs" / "bench" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    results.mkdir(parents=True, exist_ok=True)
    failed = []
    with c.cd(str(repo)):
        for name in names:
            done = c.run(f"{sys.executable} bench/{name}.py{' --quick' if quick else ''} "
                         f"--json {results / (name + '.json')}", warn=True, pty=False)
            if not done or done.exited:
                failed.append(name)
        report = c.run(f"{sys.executable} bench/report.py {results}", hide=True, warn=True)
    if report and report.ok:
        (results / "report.md").write_text(report.stdout)
    print(f"figures: {results}/ (report.md: the tables for docs/benchmarks.md)")
    if failed:
        raise Exit(f"benchmarks failed: {', '.join(failed)}", code=1)


def namespace() -> Collection:
    """``invoke --list``: the verbs' tasks (``zk.start`` in the collection ``zk``) and the
    hand-written ones."""
    root, hypertf = Collection(train, export, sweep, test, bench), cli.build_parser()
    for spec in VERB_TASKS:
        *path, name = spec.name.split(".")
        collection = root
        for part in path:
            if part not in collection.collections:
                collection.add_collection(Collection(part))
            collection = collection.collections[part]
        collection.add_task(verb_task(spec, hypertf), name)
    return root


ns = namespace()

"""The two command lines agree: ``hypertf train`` (argparse) and ``invoke train`` accept the
README's options spelled the same, type them the same and build the same TrainRequest.

Invoke's own parser and argparse parse real command lines; no ZooKeeper, no network (the
pipe test runs ``hypertf`` in a shell pipeline).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from invoke import Collection, Context, Parser, Task
from invoke.parser import ParseResult

import tasks
from hypertf.cli import main as cli
from hypertf.launch.request import TRAIN_OPTIONS, Option, TrainRequest
from hypertf.store import credentials

REPO = Path(__file__).resolve().parents[2]


def invoke_parse(argv: list[str]) -> ParseResult:
    """``invoke <argv>`` as Invoke's parser reads it (the task's contexts, no core flags)."""
    return Parser(contexts=tasks.ns.to_contexts()).parse_argv(argv)


def invoke_tasks(collection: Collection, prefix: str = "") -> Iterator[tuple[str, Task]]:
    """Every task of the namespace with its dotted name (``auth.add-user``)."""
    for name, task in collection.tasks.items():
        yield prefix + name, task
    for name, sub in collection.collections.items():
        yield from invoke_tasks(sub, f"{prefix}{name}.")


def numeric_options() -> list[tuple[str, str, type, list[str]]]:
    """(task, option, type, positional values) for each int or float option of every task,
    its type read from the task's annotations (what a user sees in the signature)."""
    found = []
    for name, task in invoke_tasks(tasks.ns):
        arguments = task.get_arguments()
        positionals = ["x" for argument in arguments if argument.positional]
        for argument in arguments:
            kind = tasks.option_kind(task.body, argument.attr_name or argument.name)
            if kind in (int, float) and not argument.positional:
                found.append((name, argument.name, kind, positionals))
    return found


NUMERIC = numeric_options()


def test_the_numeric_options_found_include_the_ones_that_broke() -> None:
    """The scan finds optional numbers (None default) too: invoke train --timeout was text."""
    found = {(task, option) for task, option, _, _ in NUMERIC}
    assert {("train", "timeout"), ("train", "worker"), ("sweep", "max_concurrent"),
            ("jobs", "last"), ("lab.up", "hosts")} <= found


@pytest.mark.parametrize(("task", "option", "kind", "positionals"), NUMERIC,
                         ids=[f"{t}--{o}" for t, o, _, _ in NUMERIC])
def test_every_numeric_invoke_option_parses_as_its_type(
        task: str, option: str, kind: type, positionals: list[str]) -> None:
    """``invoke TASK --option 7`` gives the task the number 7, not the text '7'."""
    flag = "--" + option.replace("_", "-")
    parsed = invoke_parse([task, *positionals, flag, "7"])[0]
    value = parsed.args[option].value
    assert type(value) is kind and value == 7, f"invoke {task} {flag} 7 gave {value!r}"


# -- the README's train table against both command lines ----------------------------------


def readme_train_flags() -> set[str]:
    """The flags in the first column of the README's ``train`` options table."""
    text = (REPO / "README.md").read_text()
    section = text.split("### `train` options", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    firsts = [re.split(r"(?<!\\)\|", row)[1] for row in rows]
    return {flag for cell in firsts for flag in re.findall(r"`(-{1,2}[a-z][a-z-]*)", cell)}


def test_the_readme_table_lists_every_train_option_and_no_other() -> None:
    """One table in the code, one in the README: neither has an option the other lacks."""
    declared = {"-i", "--inventory", *(option.flag for option in TRAIN_OPTIONS)}
    assert readme_train_flags() == declared


def sample_value(option: Option) -> list[str]:
    """A value other than the default for one option, as command-line words."""
    if option.kind is bool:
        return [option.flag]
    if option.kind is list:
        return [option.flag, "A=1", option.flag, "B=two words"]
    samples: dict[str, str] = {"script": "train.py", "policy": "pack", "sync": "code",
                               "checkpoint_dir": "/shared/ckpt", "rendezvous": "coordinator"}
    text = samples.get(option.name, {int: "3", float: "7.5"}.get(option.kind, "v"))
    return [option.flag, text]


def both_requests(argv: list[str]) -> tuple[TrainRequest, TrainRequest, str, str]:
    """The request and inventory ``hypertf train ARGV`` and ``invoke train ARGV`` make."""
    args = cli.parse_train(argv)
    assert args.hyperparameters == [], f"hypertf train took {args.hyperparameters} as the script's"
    values = invoke_parse(["train", *argv])[0].as_kwargs
    return (cli.train_request(args), tasks.train_request(values), args.inventory,
            tasks._inv(values["inventory"]))


ALL_BUT_ONE = [word for option in TRAIN_OPTIONS if option.name != "no_legacy_flags"
               for word in sample_value(option)]


@pytest.mark.parametrize("flag", sorted(readme_train_flags()))
def test_each_readme_option_is_accepted_by_both_command_lines(flag: str) -> None:
    """``--legacy-flags`` as the README spells it is a flag for invoke too (it wanted a value)."""
    option = {o.flag: o for o in TRAIN_OPTIONS}.get(flag)
    words = sample_value(option) if option else [flag, "inv.yml"]
    script = [] if flag == "--script" else ["--script", "t.py"]
    hypertf, invoked, inv_a, inv_b = both_requests([*script, *words])
    assert hypertf == invoked and inv_a == inv_b


@pytest.mark.parametrize("argv", [
    [*ALL_BUT_ONE, "-i", "inv.yml"],
    ["--script", "t.py", "--no-legacy-flags", "--idle-timeout", "0"],
    ["--script", "t.py"],
], ids=["every-option", "no-legacy-flags", "defaults"])
def test_both_command_lines_build_the_same_request(argv: list[str]) -> None:
    """The same words give the same TrainRequest, field by field."""
    hypertf, invoked, inv_a, inv_b = both_requests(argv)
    assert hypertf == invoked and inv_a == inv_b


def test_every_option_reaches_its_field() -> None:
    """Given every option, every field but the script's arguments leaves its default."""
    request = both_requests([*ALL_BUT_ONE])[0]
    default = TrainRequest(script="t.py")
    changed = {name for name in vars(default) if getattr(request, name) != getattr(default, name)}
    assert changed == set(vars(default)) - {"args"}
    assert (request.timeout, request.env, request.wait) == (7.5, ("A=1", "B=two words"), False)
    assert request.legacy_flags == "on"


def test_legacy_flags_on_and_off_together_is_a_usage_error() -> None:
    from hypertf.core.errors import UsageError

    args = cli.parse_train(["--script", "t.py", "--legacy-flags", "--no-legacy-flags"])
    with pytest.raises(UsageError, match="exclude each other"):
        cli.train_request(args)


def test_invoke_help_names_each_option_once() -> None:
    """No stray short flags: ``invoke --help train`` showed ``--, --idle-fail``."""
    names = {name for argument in tasks.train.get_arguments() for name in argument.names}
    assert names == {"i", "inventory", *(option.name.replace("_", "-")
                                         for option in TRAIN_OPTIONS)}


# -- script arguments named, typos caught ---------------------------------------------------


def test_a_near_miss_of_an_option_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-restart 1`` still reaches the script, but stderr says so and suggests the fix."""
    args = cli.parse_train(["--script", "t.py", "--max-restart", "1", "--epochs", "3"])
    assert args.hyperparameters == ["--max-restart", "1", "--epochs", "3"]
    assert args.max_restarts == 0
    err = capsys.readouterr().err
    assert "passed to the script: --max-restart 1 --epochs 3" in err
    assert "did you mean --max-restarts?" in err
    assert "--epochs: did you mean" not in err


def test_arguments_after_the_double_dash_are_not_reported(
        capsys: pytest.CaptureFixture[str]) -> None:
    """'--' says these are the script's: nothing to warn about."""
    cli.parse_train(["--script", "t.py", "--", "--max-restart", "1"])
    assert capsys.readouterr().err == ""


def test_an_option_given_with_equals_is_matched_too() -> None:
    note = cli.script_args_note(["--idle-timout=30", "--lr=0.1"])
    assert note and "did you mean --idle-timeout?" in note and "--lr" in note.splitlines()[0]
    assert len(note.splitlines()) == 2


# -- a reader that leaves: | head -1 -------------------------------------------------------


def pipeline(command: str, cwd: Path) -> tuple[int, str]:
    """Run ``command`` in bash; the exit status of its first stage and its stderr."""
    done = subprocess.run(["bash", "-c", f"{command}; exit ${{PIPESTATUS[0]}}"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


HYPERTF = f"{sys.executable} -m hypertf.cli"


def test_a_long_listing_into_head_ends_quietly(tmp_path: Path) -> None:
    """``hypertf sweep status ID | head -1`` on 10000 trials: more than a pipe holds, so the
    writer is still writing when head leaves (a traceback and exit 1 before)."""
    make = ("from hypertf.sweep import driver as sweep; "
            "from hypertf.sweep.spec import SweepSpec, expand, parse_grid_option; "
            "from hypertf.launch.request import TrainRequest; "
            "grid = parse_grid_option(['lr=' + ','.join(map(str, "
            "range(10000)))]); print(sweep.create('inv.yml', TrainRequest(script='t.py'), "
            "expand(SweepSpec(script='t.py', train={}, grid=grid)), 'acc', 'max', 2, "
            "None).sweep_id)")
    sweep_id = subprocess.run([sys.executable, "-c", make], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()
    code, err = pipeline(f"{HYPERTF} sweep status {sweep_id} | head -1", tmp_path)
    assert err == "" and code in (0, cli.SIGPIPE_EXIT)
    code, err = pipeline(f"{HYPERTF} sweep status {sweep_id} | grep -q trials", tmp_path)
    assert err == "" and code in (0, cli.SIGPIPE_EXIT)


# -- auth add-user names where the file goes -----------------------------------------------


def test_add_user_names_the_default_directory_of_the_cluster() -> None:
    """With hypertf_zk_credentials set (a lab: .../credentials) the default named is the
    cluster's own directory, not ~/.hypertf/credentials/credentials/."""
    hosts, root = "10.0.0.1:2181", "/hypertf"
    setting = "/srv/lab/credentials"
    directory = credentials.credentials_dir(setting, hosts, root)
    note = credentials.handover_note("alice", directory, setting, hosts, root)
    default = credentials.credentials_dir(None, hosts, root)
    assert "credentials/credentials" not in note
    assert f"~/.hypertf/credentials/{default.name}/" in note
    assert setting in note and note.startswith(f"{directory}/user.alice.yml: give this file")


def test_add_user_without_the_setting_names_the_default() -> None:
    hosts, root = "zk1:2181,zk2:2181", "/team"
    directory = credentials.credentials_dir(None, hosts, root)
    note = credentials.handover_note("bob", directory, None, hosts, root)
    assert f"by default ~/.hypertf/credentials/{directory.name}/)" in note


# -- a sweep spec's train mapping uses the same names ---------------------------------------


def test_a_sweep_spec_names_train_options_as_the_table_does() -> None:
    """``train: {worker: 2, no_wait: true, ...}`` becomes the options of each trial."""
    from hypertf.cli.sweep import train_argv_of
    from hypertf.sweep.spec import SweepSpec

    spec = SweepSpec(script="t.py", grid={"lr": [0.1]}, train={
        "worker": 2, "no_wait": True, "legacy_flags": True, "env": ["A=1"], "timeout": 60,
        "args": ["--epochs", 3]})
    request = cli.train_request(cli.parse_train(train_argv_of(spec)))
    assert request == TrainRequest(script="t.py", workers=2, wait=False, legacy_flags="on",
                                   env=("A=1",), timeout=60.0, args=("--epochs", "3"))


@pytest.mark.parametrize("key", ["detach", "script", "workers", "wait"])
def test_a_sweep_spec_refuses_what_is_no_trial_option(key: str) -> None:
    from hypertf.cli.sweep import train_argv_of
    from hypertf.core.errors import UsageError
    from hypertf.sweep.spec import SweepSpec

    with pytest.raises(UsageError, match=f"train option '{key}' is unknown"):
        train_argv_of(SweepSpec(script="t.py", grid={"lr": [0.1]}, train={key: 1}))


# -- every other verb: hypertf VERB and invoke VERB agree (hypertf.cli.options) -------------

BOTH = {  # invoke's task: hypertf's words (an action word included)
    "cluster.status": "status", "jobs": "jobs", "kill": "kill", "cancel": "cancel",
    "queue": "queue", "hold": "hold", "unhold": "unhold", "logs": "logs",
    "dashboard": "dashboard", "zk.start": "zk start", "zk.stop": "zk stop",
    "zk.status": "zk status", "agent.start": "agents start", "agent.stop": "agents stop",
    "usage": "usage",
    "auth.init": "auth init", "auth.add-user": "auth add-user", "auth.limits": "auth limits",
    "auth.accounts": "auth accounts", "auth.footprint": "auth footprint",
    "cluster.setup": "cluster setup", "cluster.teardown": "cluster teardown",
    "lab.up": "lab up", "lab.down": "lab down", "lab.list": "lab list",
}
OWN_TABLES = {"train", "export", "sweep"}  # TRAIN_OPTIONS: tested above
INVOKE_ONLY = {"test", "bench"}  # the repository's, not the package's


def test_every_invoke_task_is_paired_with_its_hypertf_verb() -> None:
    """A new task is checked below, or said to have no hypertf twin."""
    assert {name for name, _ in invoke_tasks(tasks.ns)} == {*BOTH, *OWN_TABLES, *INVOKE_ONLY}


def hypertf_verb(words: str) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser of ``hypertf WORDS`` and the words left for it (a zk or agents action)."""
    return cli.verb_parser(cli.build_parser(), words)


def hypertf_options(words: str) -> dict[str, tuple[str | None, bool]]:
    """``hypertf WORDS``'s options (long flag without dashes, or the positional's name, in
    Python spelling) with their help and whether each is a positional; -h and the action
    word aside."""
    parser, left = hypertf_verb(words)
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or (left and action.choices):
            continue
        longs = [s for s in action.option_strings if s.startswith("--")]
        name = longs[0][2:].replace("-", "_") if longs else action.dest
        found[name] = (action.help, not action.option_strings)
    return found


def invoke_options(task: str) -> dict[str, tuple[str | None, bool]]:
    arguments = dict(invoke_tasks(tasks.ns))[task].get_arguments()
    return {(a.attr_name or a.name): (a.help, a.positional) for a in arguments}


@pytest.mark.parametrize(("task", "words"), BOTH.items(), ids=list(BOTH))
def test_both_command_lines_name_the_same_options_with_the_same_help(
        task: str, words: str) -> None:
    """``hypertf WORDS --help`` and ``invoke --help TASK``: the same options, positionals
    and help (``invoke jobs`` had no --json; ``hypertf logs``'s --follow said more)."""
    assert hypertf_options(words) == invoke_options(task)


def sample_argv(words: str) -> list[str]:
    """A value other than the default for every option of ``hypertf WORDS``."""
    parser, left = hypertf_verb(words)
    positionals, flags = [], []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or (left and action.choices):
            continue
        if not action.option_strings:
            positionals.append("K")
        elif action.nargs == 0:
            flags.append(action.option_strings[-1])
        else:
            flags += [action.option_strings[-1],
                      "7" if action.type in (int, float) else "v.yml"]
    return [*positionals, *flags]


def both_calls(task: str, words: str, argv: list[str],
               monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    """(function, keyword arguments) that ``hypertf WORDS ARGV`` and ``invoke TASK ARGV``
    would run (hypertf.cli.commands), nothing run."""
    called: list[tuple[object, dict[str, object]]] = []
    monkeypatch.setattr(tasks, "_call", lambda func, **kwargs: called.append((func, kwargs)))
    parsed = invoke_parse([task, *argv])[0]
    dict(invoke_tasks(tasks.ns))[task].body(Context(), **parsed.as_kwargs)
    hypertf = cli.verb_call(cli.build_parser().parse_args([*words.split(), *argv]))
    return hypertf, called[0]


@pytest.mark.parametrize(("task", "words"), BOTH.items(), ids=list(BOTH))
def test_both_command_lines_call_the_same_command_with_the_same_defaults(
        task: str, words: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without options (the defaults; a positional given), and with every option given."""
    positionals = [word for word in sample_argv(words) if word == "K"]
    hypertf, invoked = both_calls(task, words, positionals, monkeypatch)
    assert hypertf == invoked
    hypertf, invoked = both_calls(task, words, sample_argv(words), monkeypatch)
    assert hypertf == invoked


def test_the_option_table_feeds_both(monkeypatch: pytest.MonkeyPatch) -> None:
    """One spelling for a case that needs care: --no-agents is the command's agents=False."""
    from hypertf.cli.options import VERB_OPTIONS

    assert "json" in {option.name for option in VERB_OPTIONS["jobs"]}
    hypertf, invoked = both_calls("lab.up", "lab up", ["--no-agents"], monkeypatch)
    assert hypertf == invoked and invoked[1]["agents"] is False  # type: ignore[index]

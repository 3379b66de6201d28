"""tasks.py's tasks of hypertf's verbs are made from the verb table (VERB_OPTIONS) and
hypertf's tree: every verb there has its task with its options, and every task named in the
README, docs/ and dev.sh exists. (test_options.py checks each pair's help and call.)

No network: the namespace is built and Invoke's objects are read.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import tasks
from hypertf.cli import main as cli
from hypertf.cli import trainargs
from hypertf.cli.options import VERB_OPTIONS
from tests.unit.test_options import invoke_tasks

REPO = Path(__file__).resolve().parents[2]
HAND_WRITTEN = {"train", "export", "sweep", "test", "bench"}  # TRAIN_OPTIONS; the repository's
TASKS = dict(invoke_tasks(tasks.ns))
BY_NAME = {spec.name: spec for spec in tasks.VERB_TASKS}


def verb_words(spec: tasks.VerbTask) -> str:
    """The VERB_OPTIONS key of a task's words (``zk start``: ``zk``)."""
    _, action = cli.verb_parser(cli.build_parser(), spec.words)
    words = spec.words.split()
    return " ".join(words[:len(words) - len(action)])


def test_the_namespace_is_the_verb_tasks_and_the_hand_written_ones() -> None:
    assert set(TASKS) == set(BY_NAME) | HAND_WRITTEN
    assert len(BY_NAME) == len(tasks.VERB_TASKS)


def test_every_verb_of_the_table_has_a_task() -> None:
    assert {verb_words(spec) for spec in tasks.VERB_TASKS} == set(VERB_OPTIONS)


def test_every_action_of_a_verb_has_its_task() -> None:
    """``hypertf zk {start,stop,status}``: zk.start, zk.stop, zk.status."""
    for words in VERB_OPTIONS:
        parser, left = cli.verb_parser(cli.build_parser(), words)
        assert not left, words
        for action in parser._actions:
            if action.dest == "action" and action.choices and not isinstance(
                    action, argparse._SubParsersAction):
                wanted = {f"{words} {choice}" for choice in action.choices}
                assert wanted <= {spec.words for spec in tasks.VERB_TASKS}, words


def test_each_verb_task_has_the_options_of_its_table_row() -> None:
    """Names, positionals and help from VERB_OPTIONS, with -i/--inventory where hypertf's
    verb has it; the one line of ``invoke --list`` from VERB_TASKS."""
    for spec in tasks.VERB_TASKS:
        task = TASKS[spec.name]
        options = VERB_OPTIONS[verb_words(spec)]
        parser, _ = cli.verb_parser(cli.build_parser(), spec.words)
        arguments = {a.attr_name or a.name: (a.positional, a.help) for a in task.get_arguments()}
        expected = {o.name: (o.positional, o.help) for o in options}
        if any(action.dest == "inventory" for action in parser._actions):
            expected["inventory"] = (False, trainargs.INVENTORY_HELP)
        assert arguments == expected, spec.name
        assert task.__doc__ == spec.doc and spec.doc.endswith(".")


def test_every_task_the_documentation_names_exists() -> None:
    """``invoke zk.start``, ``invoke cluster.status``, ``.venv/bin/invoke agent.start``..."""
    named: dict[str, set[str]] = {}
    for path in [REPO / "README.md", REPO / "dev.sh", *(REPO / "docs").glob("*.md")]:
        for found in re.finditer(r"(?:^|`|bin/)invoke (?:--help )?([a-z][a-z.-]*)",
                                 path.read_text(), re.MULTILINE):
            named.setdefault(found.group(1), set()).add(path.name)
    assert {"train", "cluster.status", "zk.start", "agent.start"} <= set(named)
    assert {name: where for name, where in named.items() if name not in TASKS} == {}

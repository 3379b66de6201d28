"""The options of every verb but ``train``, ``export`` and ``sweep`` (those have
launch.request.TRAIN_OPTIONS), declared once: ``hypertf VERB`` (argparse, hypertf.cli.main)
and ``invoke VERB`` (tasks.py) are both built from ``VERB_OPTIONS``, so the two name the same
options with the same types, defaults and help.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hypertf.launch.request import Option


@dataclass(frozen=True)
class VerbOption(Option):
    """One option of a verb. Beyond ``Option``: a positional argument (``task_key``), a short
    flag for argparse (Invoke picks its own), and the command's parameter where its name is
    not the option's (``--json``: ``as_json``; ``--no-agents``: ``agents``, negated)."""

    positional: bool = False
    short: str | None = None
    dest: str | None = None
    negated: bool = False

    @property
    def target(self) -> str:
        """The keyword argument of the verb's function (hypertf.cli.commands, clusterverbs...)
        that receives it."""
        return self.dest or self.name


def _task_key(required: bool = True) -> VerbOption:
    return VerbOption("task_key", str, None, "the job's task key (hypertf jobs, hypertf queue)",
                      "TASK_KEY", required=required, positional=True)


def _json(help: str) -> VerbOption:
    return VerbOption("json", bool, False, help, dest="as_json")


def _user(help: str) -> VerbOption:
    # optional for argparse, so that the command names what is missing (UsageError, exit 2)
    return VerbOption("user", str, None, help, "USER", positional=True)


PRINT_DIR = VerbOption("print_dir", bool, False,
                       "end with the credentials directory alone on a line (for Ansible)")
HOST = VerbOption("host", str, None, "only this node (default: every GPU node)", "HOST")

VERB_OPTIONS: dict[str, tuple[VerbOption, ...]] = {
    "status": (_json("print one JSON object instead of the table (every agent record read, "
                     "with every GPU's details)"),
               VerbOption("direct", bool, False, "read every agent record and sync the matrix "
                          "here instead of the keeper's view (used past 64 hosts)")),
    "jobs": (VerbOption("last", int, 20, "how many jobs (default 20)", "N"),
             _json("print the records as JSON")),
    "kill": (_task_key(),),
    "cancel": (_task_key(),),
    "queue": (_json("print the rows as JSON"),
              VerbOption("shares", bool, False, "each user's fair share instead: share, "
                         "decayed usage, GPUs held, factor, this month's GPU-hours"),
              VerbOption("direct", bool, False, "run the keeper's admission pass here on "
                         "what ZooKeeper holds instead of reading the keeper's view")),
    "usage": (VerbOption("since", str, None, "from this day, YYYY-MM-DD (default: the first "
                         "of this month, UTC)", "DATE"),
              VerbOption("until", str, None, "up to this day, included (default: today)",
                         "DATE"),
              VerbOption("by", str, "user", "one row per user, day or gpu_model (default "
                         "user)", "user|day|gpu_model"),
              _json("print the report as JSON"),
              VerbOption("csv", bool, False, "print the report as CSV", dest="as_csv")),
    "hold": (_task_key(),),
    "unhold": (_task_key(),),
    "logs": (_task_key(),
             VerbOption("follow", bool, False, "follow until the tasks end (a waiting job: "
                        "once it starts)", short="f"),
             VerbOption("task", str, None, "only this task, e.g. worker:1", "TASK")),
    "dashboard": (VerbOption("port", int, 8470, "TCP port (default 8470)", "PORT"),
                  VerbOption("bind", str, None, "address to listen on (default 127.0.0.1; "
                             "any other wants the token in the URL printed at start)",
                             "ADDRESS")),
    "zk": (),
    "agents": (HOST,),
    "auth init": (VerbOption("reset", bool, False, "delete a root made without credentials "
                             "first, then secure it"), PRINT_DIR),
    "auth add-user": (_user("the user's name (their login on the machine they use)"),
                      VerbOption("ssh_key", str, None, "on a per-user cluster: the user's own "
                                 "SSH public key for their node account (default: one is made "
                                 "for them, user.NAME.ssh beside the credential)", "PUB_FILE"),
                      VerbOption("uid", int, None, "the managed account's uid (default: the "
                                 "next free one from 20000)", "N"),
                      VerbOption("no_nodes", bool, False, "register only: make the account on "
                                 "the nodes later (invoke cluster.setup)"),
                      PRINT_DIR),
    "auth accounts": (_json("print the register as JSON (what the user_accounts role reads)"),),
    "auth footprint": (_json("print the footprint as JSON"),
                       VerbOption("delete_junk", str, None, "first delete this user's junk: "
                                  "the names in their folders that are not their task keys "
                                  "(their jobs and leases stay)", "USER")),
    "auth limits": (_user("the registered user to limit"),
                    VerbOption("max_priority", int, None, "the highest --priority that counts "
                               "for the user (default 10)", "N"),
                    VerbOption("gpu_limit", int, None, "GPUs the user may hold at once (0: "
                               "hypertf_user_gpu_limit)", "N"),
                    VerbOption("share", float, None, "the user's fair share against the "
                               "others' (default 1; 3: three times as much GPU time)", "N"),
                    VerbOption("gpu_hours_per_month", float, None, "the user's budget: past "
                               "it their new jobs wait (reason Budget); 0: none", "N"),
                    VerbOption("no_preempt_ok", bool, False, "the user's running jobs are never "
                               "preempted (hypertf_preempt); --preemptible undoes it"),
                    VerbOption("preemptible", bool, False, "the user's jobs may be preempted "
                               "again (the default; clears --no-preempt-ok)")),
    "cluster setup": (VerbOption("ask_pass", bool, False, "ask for the SSH password (first "
                                 "contact; needs sshpass)"),
                      VerbOption("check", bool, False, "dry run: show what would change, "
                                 "change nothing")),
    "cluster teardown": (VerbOption("zookeeper", bool, False, "also stop ZooKeeper and remove "
                                    "its service"),
                         VerbOption("purge", bool, False, "also remove virtualenvs, work "
                                    "directories and ZooKeeper data")),
    "lab up": (VerbOption("hosts", int, 3, "number of hosts (network namespaces; default 3)",
                          "N"),
               VerbOption("gpus", int, 4, "static GPUs per host (default 4)", "N"),
               VerbOption("no_agents", bool, False, "bare hosts: no agent started",
                          dest="agents", negated=True),
               VerbOption("zookeeper_members", int, 1, "1: one ZooKeeper server; 3 or 5: a "
                          "quorum ensemble", "N"),
               VerbOption("shared_account", bool, False, "every user's tasks as this "
                          "machine's root, as before (default: each user an account of its own, "
                          "removed with the lab)", dest="per_user", negated=True)),
    "lab down": (VerbOption("name", str, None, "lab id (default: every lab)", "NAME"),),
    "lab list": (),
}
"""Each verb's options (``-i/--inventory`` aside), by its words on ``hypertf``'s command line
(``zk`` and ``agents`` take their action as a positional word; Invoke has a task per action)."""


def add_arguments(parser: argparse.ArgumentParser, options: tuple[VerbOption, ...]) -> None:
    """The options as argparse arguments, each stored under the command's parameter name."""
    for option in options:
        if option.positional:
            parser.add_argument(option.target, nargs=None if option.required else "?",
                                default=option.default, metavar=option.metavar,
                                help=option.help)
            continue
        names = [*([f"-{option.short}"] if option.short else []), option.flag]
        if option.kind is bool:
            parser.add_argument(*names, dest=option.target, help=option.help,
                                action="store_false" if option.negated else "store_true")
        else:
            parser.add_argument(*names, dest=option.target, type=option.kind,
                                default=option.default, required=option.required,
                                metavar=option.metavar, help=option.help)


def command_args(options: tuple[VerbOption, ...], values: Mapping[str, Any]) -> dict[str, Any]:
    """The command's keyword arguments for the options' values (keyed by ``Option.name``, as
    Invoke gives them)."""
    return {option.target: (not values[option.name]) if option.negated else values[option.name]
            for option in options}

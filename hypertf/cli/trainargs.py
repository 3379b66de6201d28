"""``hypertf train``'s command line: request.TRAIN_OPTIONS as argparse options, and the
rule that ``--`` or any unknown option starts the script's own arguments. Kept apart from
the CLI's tree so that the sweep (which checks a trial's options with it) needs no CLI.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
import sys
from collections.abc import Sequence

from hypertf.config import environment
from hypertf.config.settings import DEFAULT_INVENTORY
from hypertf.launch.request import TRAIN_OPTIONS, TrainRequest

INVENTORY_HELP = f"inventory YAML (default ${environment.INVENTORY.name} or {DEFAULT_INVENTORY})"


def default_inventory() -> str:
    """``$HYPERTF_INVENTORY``, else the embedded default (inventory/local.yml)."""
    return environment.INVENTORY.read()  # its default is DEFAULT_INVENTORY (a test pins it)


def inventory_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--inventory", default=default_inventory(), help=INVENTORY_HELP)


def train_request(args: argparse.Namespace) -> TrainRequest:
    return TrainRequest.from_options(vars(args), args.hyperparameters)


def add_train_options(p: argparse.ArgumentParser) -> None:
    """The options of ``train`` (TRAIN_OPTIONS); everything else is passed to the script."""
    inventory_option(p)
    for option in TRAIN_OPTIONS:
        if option.kind is bool:
            p.add_argument(option.flag, action="store_true", help=option.help)
        elif option.kind is list:
            p.add_argument(option.flag, action="append", default=option.default,
                           metavar=option.metavar, help=option.help)
        else:
            p.add_argument(option.flag, type=option.kind, default=option.default,
                           required=option.required, metavar=option.metavar, help=option.help)


def train_flags() -> list[str]:
    """Every flag ``hypertf train`` knows, for telling a typo from a script argument."""
    return ["--inventory", *(option.flag for option in TRAIN_OPTIONS)]


def script_args_note(unknown: Sequence[str]) -> str | None:
    """Say which arguments go to the script because HyperTF does not know them, and name
    the option a typo was meant to be: ``--max-restart 1`` silently runs without restarts."""
    if not unknown:
        return None
    lines = [f"hypertf: not HyperTF options, passed to the script: {shlex.join(unknown)} "
             f"(put them after '--' to say so)"]
    for word in unknown:
        flag = word.partition("=")[0]
        if flag.startswith("--") and flag != "--":
            close = difflib.get_close_matches(flag, train_flags(), n=1, cutoff=0.75)
            if close:
                lines.append(f"hypertf: {flag}: did you mean {close[0]}?")
    return "\n".join(lines)


def parse_train(argv: Sequence[str]) -> argparse.Namespace:
    """``--`` or any unknown option starts the hyperparameters, kept verbatim; the unknown
    ones are named on stderr (with the option a typo resembles)."""
    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="hypertf train", allow_abbrev=False)
    add_train_options(parser)
    args, unknown = parser.parse_known_args(argv)
    note = script_args_note(unknown)
    if note:
        print(note, file=sys.stderr)
    args.hyperparameters = unknown + extra
    args.command = "train"
    return args

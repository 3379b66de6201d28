"""Reading an inventory's YAML safely: limits first, then precise messages.

Limits on an inventory file are checked before anything parses or expands it.

An inventory is user input that ansible-core and PyYAML will expand: a few hundred bytes of
nested aliases (a "billion laughs") or a huge file would take every CPU and gigabytes of
memory. So before either reads it we check its size and walk its YAML *events* (which
never expand aliases), counting the nodes the document would expand to and its nesting
depth. The limits are far above any real cluster's inventory.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import yaml

from hypertf.config.settings import DEFAULT_INVENTORY
from hypertf.core.errors import HyperTFError, InventoryError

MAX_FILE_BYTES = 8 * 1024 * 1024  # a 10,000-host inventory with variables is about 2 MB
MAX_FILES = 1000  # files of an inventory directory (group_vars and host_vars included)
MAX_DEPTH = 64  # nested mappings/sequences
MAX_NODES = 1_000_000  # scalars and collections after expanding every alias

_COLLECTION_END = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def check_size(where: str, size: int) -> None:
    if size > MAX_FILE_BYTES:
        raise InventoryError(
            f"{where}: {size} bytes is more than the {MAX_FILE_BYTES // (1024 * 1024)} MiB an "
            f"inventory file may have; split it into an inventory directory"
        )


def check_text(where: str, text: str) -> None:
    """Refuse NUL bytes, too deep nesting and alias expansion beyond the limits."""
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise InventoryError(f"{where}: line {line} holds a NUL byte; remove it")
    depth = 0
    nodes = 0
    anchors: dict[str, int] = {}
    open_anchors: list[tuple[str | None, int]] = []  # per open collection: anchor, start
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                nodes += anchors.get(event.anchor or "", 1)
            elif isinstance(event, yaml.ScalarEvent):
                nodes += 1
                if event.anchor:
                    anchors[event.anchor] = 1
            elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                nodes += 1
                depth += 1
                open_anchors.append((event.anchor, nodes))
                if depth > MAX_DEPTH:
                    mark = event.start_mark
                    raise InventoryError(
                        f"{where}: line {mark.line + 1 if mark else '?'}: nesting deeper than "
                        f"{MAX_DEPTH} levels; an inventory needs a handful"
                    )
            elif isinstance(event, _COLLECTION_END):
                depth -= 1
                anchor, start = open_anchors.pop()
                if anchor:
                    anchors[anchor] = nodes - start + 1
            if nodes > MAX_NODES:
                raise InventoryError(
                    f"{where}: expands to more than {MAX_NODES} values through YAML "
                    f"aliases (an alias bomb?); write the values out or use group vars"
                )
    except yaml.YAMLError:
        return  # malformed: the parser that reads it next says where, with its message


MERGE_TAG = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a duplicated host is a mistake.
    Merge keys (``<<: *defaults``, common in Ansible inventories) are not duplicates: the
    keys written out override the merged ones, as YAML says. Subclasses for other files
    (sweep specs) set ``error`` to their own exception class."""

    error: type[HyperTFError] = InventoryError

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue  # SafeLoader's construct_mapping merges these
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError as err:
                mark = key_node.start_mark
                raise self.error(
                    f"line {mark.line + 1}, column {mark.column + 1}: a mapping key must be "
                    f"a plain value, not {key!r}"
                ) from err
            if key in seen:
                mark = key_node.start_mark
                raise self.error(
                    f"line {mark.line + 1}, column {mark.column + 1}: "
                    f"{key!r} appears twice in the same mapping; keep one"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


YAML_SUFFIXES = (".yml", ".yaml", ".json")


def source_files(path: Path) -> list[Path]:
    """The inventory's files (the file, or every file of an inventory directory), each
    checked for size; ``check_files`` checks their text before anything parses them."""
    try:
        path.stat()
    except FileNotFoundError as err:
        raise InventoryError(
            f"inventory {path} not found: pass an existing file or directory with "
            f"-i/--inventory (the default is {DEFAULT_INVENTORY})"
        ) from err
    except OSError as err:
        why = "a symlink loop" if err.errno == errno.ELOOP else err.strerror
        raise InventoryError(f"inventory {path} cannot be read: {why}") from err
    if path.is_dir():
        files: list[Path] = []
        for folder, dirs, names in os.walk(path):  # symlinked folders are not followed
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [Path(folder) / n for n in sorted(names) if not n.startswith(".")]
            if len(files) > MAX_FILES:
                raise InventoryError(
                    f"inventory directory {path} has more than {MAX_FILES} files"
                )
    elif path.is_file():
        files = [path]  # and the group_vars/host_vars Ansible reads beside it
        for beside in (path.parent / "group_vars", path.parent / "host_vars"):
            if beside.is_dir():
                files += [f for f in sorted(beside.rglob("*")) if not f.name.startswith(".")]
        if len(files) > MAX_FILES:
            raise InventoryError(f"inventory {path}: more than {MAX_FILES} files "
                                 f"in its group_vars and host_vars")
    else:
        raise InventoryError(f"inventory {path} is neither a file nor a directory")
    for file in files:
        try:
            if file.is_file():
                check_size(str(file), file.stat().st_size)
        except OSError as err:
            why = "a symlink loop" if err.errno == errno.ELOOP else err.strerror
            raise InventoryError(f"inventory file {file} cannot be read: {why}") from err
    return files


def check_files(files: list[Path]) -> None:
    """NUL bytes, nesting and YAML expansion limits of every file, before a parse. Not on
    every command: walking a 10,000-host inventory's YAML events takes 1-8 s, and the
    parsed inventory's cache is keyed by the files' digests, so a cached parse is of files
    that passed."""
    for file in files:
        try:
            if file.is_file():
                check_text(str(file), file.read_bytes().decode("utf-8", "replace"))
        except OSError as err:
            why = "a symlink loop" if err.errno == errno.ELOOP else err.strerror
            raise InventoryError(f"inventory file {file} cannot be read: {why}") from err


def yaml_inventories(path: Path, files: list[Path]) -> list[tuple[Path, Any]]:
    """The YAML inventories among the files, read strictly (line and column, duplicate
    keys). Other files (INI inventories, files of unknown type) are left to Ansible."""
    if path.is_file():
        candidates = [path]
    else:  # Ansible reads the directory's own files; group_vars/host_vars are variables
        candidates = [f for f in files if f.parent == path and f.suffix in YAML_SUFFIXES]
    found = []
    for file in candidates:
        if file.suffix in YAML_SUFFIXES:
            found.append((file, read_yaml(file)))
            continue
        try:  # no YAML suffix: YAML if it reads as a mapping, else (INI) Ansible's
            found.append((file, read_yaml(file)))
        except InventoryError:
            continue
    return found


def read_yaml(path: Path) -> Any:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise InventoryError(
            f"{path}: byte {err.start} is not UTF-8 text; save the inventory as UTF-8"
        ) from err
    except OSError as err:
        raise InventoryError(f"inventory {path} cannot be read: {err.strerror}") from err
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)
    except InventoryError as err:
        raise InventoryError(f"{path}: {err}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise InventoryError(f"{path}: malformed YAML at {where}{problem}") from err
    if data is None:
        raise InventoryError(f"{path}: the inventory is empty; see inventory/example.yml")
    if not isinstance(data, dict):
        raise InventoryError(
            f"{path}: the top level must be a mapping of groups (usually 'all:'), "
            f"not a {type(data).__name__}"
        )
    return data

"""Limits on an inventory file, checked before anything parses or expands it.

An inventory is user input that ansible-core and PyYAML will expand: a few hundred bytes of
nested aliases (a "billion laughs") or a huge file would take every CPU and gigabytes of
memory. So before either reads it we check its size and walk its YAML *events* (which
never expand aliases), counting the nodes the document would expand to and its nesting
depth. The limits are far above any real cluster's inventory.
"""

from __future__ import annotations

import yaml

from hypertf.errors import InventoryError

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
                        f"{where}: line {mark.line + 1}: nesting deeper than {MAX_DEPTH} "
                        f"levels; an inventory needs a handful"
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

"""Who may touch a znode is declared once (hypertf.store.acltable.RULES, keyed by Layout's path
names): every path Layout names has its rule, every rule names a path, and the access table
of docs/zookeeper-layout.md says what the rules say."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from kazoo.security import Permissions

from hypertf.core.layout import Layout, path_names
from hypertf.store.acltable import RULES, Acls
from hypertf.store.credentials import Credential

DOC = Path(__file__).resolve().parents[2] / "docs" / "zookeeper-layout.md"
LETTERS = (("R", Permissions.READ), ("W", Permissions.WRITE), ("C", Permissions.CREATE),
           ("D", Permissions.DELETE), ("A", Permissions.ADMIN))
# How the doc writes each parameter of a Layout method.
PLACEHOLDERS = {"host": "<host>", "index": "<i>", "user": "<user>", "task_key": "<key>.<user>"}


def letters(perms: int) -> str:
    return "".join(letter for letter, bit in LETTERS if perms & bit)


def doc_path(name: str) -> str:
    """Layout's path ``name`` as the doc writes it: ``hosts/<host>/agent``."""
    member = getattr(Layout("<root>"), name)
    if callable(member):
        member = member(*(PLACEHOLDERS[p] for p in inspect.signature(member).parameters))
    return str(member).replace("<key>.<user>", "<key>").removeprefix("<root>/")


def test_every_path_layout_names_has_a_rule_and_every_rule_a_path() -> None:
    names = path_names()
    assert len(names) == len(set(names)) > 10
    assert not set(names) - set(RULES), f"Layout paths without a rule in acltable.RULES: " \
        f"{sorted(set(names) - set(RULES))}"
    assert not set(RULES) - set(names), f"rules for no Layout path: " \
        f"{sorted(set(RULES) - set(names))}"


def test_every_public_member_of_layout_is_a_path_path_names_finds() -> None:
    """A member that names a path without saying ``-> str`` would escape path_names (and
    with it the rules): every public member of Layout is one of its paths."""
    public = {name for name in vars(Layout) if not name.startswith("_")}
    assert public <= set(path_names()), sorted(public - set(path_names()))


def test_no_rule_lets_anyone_but_the_admin_change_an_acl_and_each_says_why() -> None:
    for name, rule in RULES.items():
        assert rule.why, name
        assert not (rule.owner | rule.keeper) & Permissions.ADMIN, name


def access_table() -> dict[str, list[str]]:
    """The doc's access table: each path it names -> its cells (admin, member, the identity
    itself, keeper, no credentials)."""
    section = DOC.read_text().split("## Access control", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) != 6:
            continue
        for path in re.findall(r"`([^`]+)`", cells[0]):
            rows[path.removeprefix("<root>/") if path != "<root>" else path] = cells[1:]
    return rows


@pytest.mark.parametrize("name", sorted(RULES))
def test_the_docs_access_table_says_what_the_rule_says(name: str) -> None:
    table = access_table()
    path = doc_path(name) if name != "root" else "<root>"
    assert path in table, f"docs/zookeeper-layout.md's access table has no row for {path}"
    admin, member, itself, keeper, nobody = table[path]
    rule = RULES[name]
    assert (admin, member, nobody) == ("RWCDA", "R", "nothing"), path
    owner = re.search(r":\s*([RWCDA]+)", itself)
    assert (owner.group(1) if owner else "") == letters(rule.owner), (path, itself)
    assert re.match(r"[RWCDA]*", keeper).group(0) == letters(rule.keeper), (path, keeper)


def test_an_acl_is_the_admin_every_member_then_the_rules_entries() -> None:
    credential = Credential(identity="user.bob", secret="s", member_secret="m",
                            admin_id="admin:x", agents_id="agents:y", keeper_id="keeper:z")
    acls = Acls(credential)
    job = acls.of("job", "user.alice:digest")
    assert [(a.id.id, a.perms) for a in job] == [
        ("admin:x", Permissions.ALL), (credential.member_id, Permissions.READ),
        ("user.alice:digest", Permissions.READ | Permissions.WRITE),
        ("keeper:z", Permissions.WRITE)]
    assert acls.job() == acls.of("job", credential.digest_id)  # its owner: by default oneself
    assert acls.of("root") == acls.root() == job[:2]
    with pytest.raises(KeyError):
        acls.of("nowhere")

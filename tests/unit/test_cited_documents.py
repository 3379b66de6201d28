"""Every document the code, the tests, the roles and the README cite is in this
repository: a reader who follows a citation finds it (docs/code-style.md, "Tests")."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CITED = re.compile(r"\bdocs/[A-Za-z0-9_.-]+\.md\b")
WHERE = ("hypertf", "tests", "bench", "roles", "playbooks", "examples", "docs")


def cited_documents() -> dict[str, list[str]]:
    """Each cited ``docs/*.md`` and where it is cited."""
    files = [REPO / "README.md", REPO / "tasks.py", REPO / "dev.sh"]
    for folder in WHERE:
        files += [p for p in (REPO / folder).rglob("*") if p.is_file()
                  and p.suffix in (".py", ".md", ".yml", ".yaml", ".sh", ".j2", ".html")]
    found: dict[str, list[str]] = {}
    for path in files:
        for name in CITED.findall(path.read_text(errors="replace")):
            found.setdefault(name, []).append(str(path.relative_to(REPO)))
    return found


def test_every_cited_document_is_in_the_repository() -> None:
    cited = cited_documents()
    assert "docs/zookeeper-layout.md" in cited  # the scan sees the citations
    missing = {name: where[:3] for name, where in cited.items() if not (REPO / name).is_file()}
    assert not missing, f"cited but not in the repository: {missing}"


def test_no_code_cites_a_document_outside_the_repository() -> None:
    """The brief's shared documents are ours to read, not the code's to cite."""
    outside = [str(p.relative_to(REPO)) for p in (REPO / "hypertf").rglob("*.py")
               if "../shared/" in p.read_text() or "STYLE.md" in p.read_text()]
    assert not outside, outside

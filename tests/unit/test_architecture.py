"""The package's import graph has no cycle, counting imports inside functions too: a cycle
hidden in a function is still two modules that cannot be understood (or tested) apart.
The layer contracts are import-linter's (pyproject.toml, run by ./dev.sh test)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hypertf"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (module level or in a function)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # ``from pkg import sub`` imports the submodule, not (only) the package
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                           else node.module for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path of module names, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_package_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_readme_map_names_every_module() -> None:
    """README's "How it fits together" lists every subpackage and every module in it."""
    readme = (PACKAGE.parent / "README.md").read_text()
    block = readme.split("## How it fits together", 1)[1].split("```", 2)[1]
    named = set(re.findall(r"\b([a-z_]+(?:\.py|/))", block))
    modules = {p.name for p in PACKAGE.rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py")
               and p.parent.name not in ("dashboard", "export")}
    packages = {p.name + "/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    missing = sorted((modules | packages) - named)
    assert not missing, f"README's module map misses {missing}"


def test_every_module_lives_in_a_subpackage_by_role() -> None:
    """Nothing is left at the top of the package: each module says where it runs by its folder."""
    flat = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert not flat, f"modules outside a subpackage: {flat}"


BLOCK_CONTROLLER = ("import sys\n"
                    "for name in ('fabric', 'invoke', 'rich', 'paramiko'):\n"
                    "    sys.modules[name] = None  # an import of them now fails, as on a node\n")


def test_a_node_runs_without_the_controllers_libraries(tmp_path: Path) -> None:
    """hypertf[node] has no Fabric, Invoke or rich: the agent, agent-ctl, tasknode and
    ``status --json`` (all a node runs) must not need them (the python_env role checks the
    venv; the provisioning tests run them there)."""
    code = BLOCK_CONTROLLER + (
        "import hypertf.node.agent, hypertf.node.tasknode, hypertf.node.service\n"
        "import hypertf.store.status  # the role's wait: hypertf status --json on the node\n"
        "from hypertf.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    workdir = tmp_path / "work"
    inventory = tmp_path / "inv.yml"
    inventory.write_text("all:\n  vars:\n    hypertf_zookeeper_hosts: 127.0.0.1:2181\n"
                         "  children:\n    gpu_nodes:\n      hosts:\n        n1:\n"
                         "          ansible_connection: local\n"
                         f"          hypertf_workdir: {workdir}\n")
    done = subprocess.run([sys.executable, "-c", code, "agent-ctl", "status", "-i",
                           str(inventory), "--host", "n1"], capture_output=True, text=True,
                          timeout=60, cwd=PACKAGE.parent)
    assert done.returncode == 1 and "agent n1 not running" in done.stdout, done.stderr


def test_no_class_is_over_250_lines() -> None:
    """Issue 49: a class past 250 lines has grown more than one job; split it into
    collaborators (its source span, decorators left out)."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > 250:
                    too_long.append(f"{module_name(path)}.{node.name}: {lines} lines")
    assert not too_long, f"classes over 250 lines: {too_long}"


def test_no_module_is_over_500_lines() -> None:
    """A module past 500 lines holds more than one concept (STYLE.md: dstack's 2,000-line
    modules are the counter-example); split it by concern into named modules."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > 500:
            too_long.append(f"{module_name(path)}: {lines} lines")
    assert not too_long, f"modules over 500 lines: {too_long}"

"""The HYPERTF_* variables HyperTF reads are declared once (hypertf.config.environment), read
through it, and documented: a read by name elsewhere in the package fails here.

Pure: the package's source is parsed, not run (one subprocess checks what an import costs).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypertf.config import environment
from hypertf.config.environment import Flag, Integer, Seconds, Text, Variable

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "hypertf"
DECLARED = {variable.name for variable in environment.VARIABLES}


def test_every_declaration_is_in_the_list_once_with_a_meaning() -> None:
    in_module = [v for v in vars(environment).values() if isinstance(v, Variable)]
    assert sorted(v.name for v in in_module) == sorted(DECLARED)
    assert len(DECLARED) == len(environment.VARIABLES)
    for variable in environment.VARIABLES:
        assert variable.name.startswith("HYPERTF_") and variable.name.isupper()
        assert variable.meaning and "\n" not in variable.meaning


# -- the parse --------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), [
    (None, 120.0), ("", 120.0), ("  ", 120.0), ("30", 30.0), (" 2.5 ", 2.5), ("0", 0.0),
    ("-4", 0.0), ("soon", 120.0),
])
def test_seconds_are_a_float_at_least_zero_else_the_default(value: str | None,
                                                            seconds: float) -> None:
    env = {} if value is None else {"HYPERTF_X": value}
    assert Seconds("HYPERTF_X", "x", 120.0).read(env) == seconds


def test_the_warm_launcher_is_off_unless_a_positive_number_is_set() -> None:
    """HYPERTF_WARM_S: 0 (off) when unset, empty, not a number or <= 0."""
    for value in ("", "no", "-1", "0"):
        assert environment.WARM_S.read({"HYPERTF_WARM_S": value}) == 0.0
    assert environment.WARM_S.read({"HYPERTF_WARM_S": "600"}) == 600.0


def test_an_integer_a_flag_and_a_text() -> None:
    count = Integer("HYPERTF_N", "n", 7)
    assert [count.read({"HYPERTF_N": v}) for v in ("3", "x", "", "-2", "1.5")] == [3, 7, 7, 0, 7]
    flag = Flag("HYPERTF_F", "f")
    assert [flag.read({"HYPERTF_F": v}) for v in ("1", " 1 ", "0", "yes", "")] == [
        True, True, False, False, False]
    assert flag.read({}) is False
    text = Text("HYPERTF_T", "t", "fallback")
    assert (text.read({"HYPERTF_T": " a b "}), text.read({"HYPERTF_T": " "}),
            text.read({})) == ("a b", "fallback", "fallback")
    assert Text("HYPERTF_U", "u").read({}) == ""


def test_read_defaults_to_this_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(environment.PREFLIGHT_CACHE_S.name, "5")
    monkeypatch.setenv(environment.PROTOCOL_STRICT.name, "1")
    assert environment.PREFLIGHT_CACHE_S.read() == 5.0 and environment.PROTOCOL_STRICT.read()
    monkeypatch.delenv(environment.PREFLIGHT_CACHE_S.name)
    assert environment.PREFLIGHT_CACHE_S.read() == 120.0


def test_the_defaults_kept_elsewhere_are_the_same() -> None:
    """Two modules above config hold the same defaults for their own callers."""
    from hypertf.config.settings import DEFAULT_INVENTORY
    from hypertf.offload import DEFAULT_MIN_FLOPS

    assert environment.INVENTORY.default == DEFAULT_INVENTORY
    assert environment.OFFLOAD_MIN_FLOPS.default == DEFAULT_MIN_FLOPS


def test_the_readers_read_through_the_declarations(monkeypatch: pytest.MonkeyPatch) -> None:
    from hypertf.cli.trainargs import default_inventory
    from hypertf.dashboard.server import new_token
    from hypertf.launch.preflightcache import ttl_s
    from hypertf.store.credentials import default_identity

    monkeypatch.setenv("HYPERTF_INVENTORY", "inv.yml")
    monkeypatch.setenv("HYPERTF_DASHBOARD_TOKEN", " mine ")
    monkeypatch.setenv("HYPERTF_PREFLIGHT_CACHE_S", "7")
    monkeypatch.setenv("HYPERTF_ZK_IDENTITY", "admin")
    assert (default_inventory(), new_token(), ttl_s(), default_identity()) == (
        "inv.yml", "mine", 7.0, "admin")
    for name in ("HYPERTF_INVENTORY", "HYPERTF_DASHBOARD_TOKEN", "HYPERTF_ZK_IDENTITY"):
        monkeypatch.setenv(name, "")
    assert default_inventory() == environment.INVENTORY.default
    assert default_identity().startswith("user.") and new_token() != ""


# -- no read by name outside config/ ----------------------------------------------------


def _hypertf_constants() -> dict[str, str]:
    """Every module-level ``NAME = "HYPERTF_..."`` of the package, by NAME."""
    found: dict[str, str] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and node.value.value.startswith("HYPERTF_")):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = node.value.value
    return found


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    return ((isinstance(node, ast.Attribute) and node.attr == "environ"
             and isinstance(node.value, ast.Name) and node.value.id == "os")
            or (isinstance(node, ast.Name) and node.id == "environ"))


def _read_names(tree: ast.AST) -> Iterator[tuple[int, ast.AST]]:
    """The name expression of every read of this process's environment:
    ``os.environ.get(X)``, ``os.environ[X]``, ``os.getenv(X)``, ``X in os.environ``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if ((isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault")
                 and _is_environ(func.value))
                or (isinstance(func, ast.Attribute) and func.attr == "getenv")
                or (isinstance(func, ast.Name) and func.id == "getenv")):
                yield node.lineno, node.args[0]
        elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
              and _is_environ(node.value)):
            yield node.lineno, node.slice
        elif (isinstance(node, ast.Compare) and len(node.comparators) == 1
              and isinstance(node.ops[0], ast.In | ast.NotIn) and _is_environ(node.comparators[0])):
            yield node.lineno, node.left


def _resolve(name: ast.AST, constants: dict[str, str]) -> str | None:
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        return name.value
    if isinstance(name, ast.Name):
        return constants.get(name.id)
    if isinstance(name, ast.Attribute):
        return constants.get(name.attr)
    return None


def hypertf_reads() -> list[tuple[str, int, str]]:
    """(module path, line, variable) of every environment read of a HYPERTF_ name by name."""
    constants, reads = _hypertf_constants(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, name in _read_names(ast.parse(path.read_text())):
            value = _resolve(name, constants)
            if value and value.startswith("HYPERTF_"):
                reads.append((str(path.relative_to(REPO)), line, value))
    return reads


def test_the_scan_finds_a_read_by_name() -> None:
    """The scan sees a read by a literal and by a constant (so it would see others)."""
    source = ('import os\nKEY = "HYPERTF_X"\n'
              'a = os.environ.get("HYPERTF_HOME")\nb = os.environ[KEY]\nc = os.getenv(KEY)\n')
    constants = {"KEY": "HYPERTF_X"}
    found = [_resolve(name, constants) for _, name in _read_names(ast.parse(source))]
    assert found == ["HYPERTF_HOME", "HYPERTF_X", "HYPERTF_X"]


def test_no_module_outside_config_reads_a_hypertf_variable_by_name() -> None:
    """``os.environ.get("HYPERTF_...")`` (or of a constant naming one) only in config/; the
    rest of the package reads hypertf.config.environment's declarations."""
    outside = [f"{path}:{line} reads {name}" for path, line, name in hypertf_reads()
               if not path.startswith("hypertf/config/")]
    assert outside == []


def test_what_config_reads_by_name_is_declared() -> None:
    undeclared = [f"{path}:{line} reads {name}" for path, line, name in hypertf_reads()
                  if name not in DECLARED]
    assert undeclared == []


def test_every_declared_variable_is_documented() -> None:
    """Each is named in the README or docs/ where its feature is described, and the README's
    map names the one list."""
    text = "\n".join(p.read_text() for p in [REPO / "README.md", *(REPO / "docs").glob("*.md")])
    assert [name for name in sorted(DECLARED) if name not in text] == []
    assert "environment.py" in (REPO / "README.md").read_text()


# -- cheap to import: the command's entry and every task's interpreter start read it -------


def test_importing_the_declarations_costs_no_library() -> None:
    """No typing, dataclasses or client library: only what the interpreter's start has."""
    code = ("import sys; before = set(sys.modules); import hypertf.config.environment; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=REPO).stdout.split()
    assert set(loaded) <= {"hypertf", "hypertf.config", "hypertf.config.environment",
                           "collections.abc"}


def test_the_offload_hook_pulls_in_no_client_library() -> None:
    """hook.py runs in every task that offloads, loaded at interpreter start."""
    code = ("import sys; import hypertf.offload.hook; print(' '.join(sorted(m for m in "
            "sys.modules if m.split('.')[0] in ('kazoo', 'ansible', 'fabric', 'paramiko', "
            "'invoke', 'yaml'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=REPO)
    assert done.stdout.split() == []

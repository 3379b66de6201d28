#!/usr/bin/env python3
"""Keep the control machine's wheel directory for the python_env role in one step.

1. Build HyperTF's wheel from its source tree with fixed timestamps (SOURCE_DATE_EPOCH), so
   an unchanged tree gives a byte-identical wheel; the wheel directory's copy is replaced
   only when the bytes differ.
2. With --require: make sure the directory holds a wheel for every requirement and its
   dependencies, downloading only when an offline resolution fails (later runs reuse it).
3. With --prune: remove superseded versions of the packages the requirements need.

Prints one JSON object: changed, wheel (HyperTF's file name, or ""), python (major.minor of
this interpreter, which the wheels are resolved for), downloaded, pruned. Standard library
and pip only; ``--check`` reports what would change and writes nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

EPOCH = "315532800"  # 1980-01-01, the earliest time a zip file can hold
SUFFIXES = (".whl", ".tar.gz", ".zip")
# What the last run resolved: lets an unchanged request skip pip's resolution (seconds).
RESOLVED = ".hypertf-resolved.json"
ARCH = os.uname().machine  # a wheel built here is tagged linux_<machine>


def pip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SOURCE_DATE_EPOCH=EPOCH, PYTHONWARNINGS="ignore",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True,
                          text=True, env=env)
    if check and done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"pip {args[0]} failed (exit {done.returncode})")
    return done


def build(source: Path, wheel_dir: Path, isolation: bool, dry: bool) -> tuple[str, bool]:
    """Build HyperTF's wheel; (file name, whether the directory's copy changed)."""
    if not (source / "pyproject.toml").is_file():
        raise SystemExit(f"{source} holds no pyproject.toml: not a HyperTF source tree")
    with tempfile.TemporaryDirectory(prefix="hypertf-wheel-") as scratch:
        pip("wheel", "--quiet", "--no-deps", *([] if isolation else ["--no-build-isolation"]),
            "--wheel-dir", scratch, str(source))
        built = sorted(Path(scratch).glob("hypertf-*.whl"))
        if len(built) != 1:
            raise SystemExit(f"expected one hypertf wheel from {source}, got {built}")
        target = wheel_dir / built[0].name
        if target.is_file() and target.read_bytes() == built[0].read_bytes():
            return target.name, False
        if not dry:
            shutil.copyfile(built[0], wheel_dir / f".{target.name}.tmp")
            os.replace(wheel_dir / f".{target.name}.tmp", target)
        return target.name, True


def fill(wheel_dir: Path, requirements: list[str], index: list[str], dry: bool,
         no_binary: list[str] | None = None) -> bool:
    """Make sure every requirement resolves from the directory; True if it had to download.
    Projects in ``no_binary`` are built here from source (their wheel, once in the
    directory, is what the nodes install)."""
    links = ["--find-links", str(wheel_dir), "--wheel-dir", str(wheel_dir)]
    built_here = all(any(project(p.name) == name and p.name.endswith(f"-linux_{ARCH}.whl")
                         for p in wheel_dir.iterdir()) for name in no_binary or ())
    if built_here and pip("wheel", "--quiet", "--no-index", *links, *requirements,
                          check=False).returncode == 0:
        return False
    if not dry:
        built = ["--no-binary", ",".join(no_binary)] if no_binary else []
        pip("wheel", "--quiet", *links, *index, *built, *requirements)
    return True


def project(filename: str) -> str:
    """The normalised project name of a wheel or sdist file name."""
    name = filename.split("-")[0] if filename.endswith(".whl") else filename.rsplit("-", 1)[0]
    return name.lower().replace("_", "-").replace(".", "-")


def prune(wheel_dir: Path, requirements: list[str], dry: bool) -> list[str]:
    """Remove superseded files: other versions of the projects the requirements need.
    Projects they do not need at all stay (another inventory may need them: no thrashing)."""
    report = pip("install", "--quiet", "--dry-run", "--ignore-installed", "--no-index",
                 "--find-links", str(wheel_dir), "--report", "-", *requirements)
    needed = {unquote(Path(urlparse(item["download_info"]["url"]).path).name)
              for item in json.loads(report.stdout)["install"]}
    projects = {project(name) for name in needed}
    removed = []
    for path in sorted(wheel_dir.iterdir()):
        if (path.is_file() and path.name.endswith(SUFFIXES) and path.name not in needed
                and project(path.name) in projects):
            removed.append(path.name)
            if not dry:
                path.unlink()
    return removed


def resolved_already(marker: Path, requirements: list[str]) -> bool:
    """The last run resolved these very requirements and every file it needed is there."""
    try:
        last = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return (last.get("requirements") == sorted(requirements)
            and all((marker.parent / name).is_file() for name in last.get("files", [None])))


def write_marker(marker: Path, requirements: list[str]) -> None:
    files = sorted(p.name for p in marker.parent.iterdir()
                   if p.is_file() and p.name.endswith(SUFFIXES))
    marker.write_text(json.dumps({"requirements": sorted(requirements), "files": files}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel-dir", required=True, type=Path)
    parser.add_argument("--source", type=Path, help="HyperTF source tree to build")
    parser.add_argument("--no-build-isolation", action="store_true")
    parser.add_argument("--hypertf", default="hypertf",
                        help="HyperTF requirement when there is no --source")
    parser.add_argument("--extras", default="",
                        help="HyperTF's extras for a built wheel, comma-separated (node)")
    parser.add_argument("--require", nargs="*", default=[],
                        help="other requirements the directory must hold")
    parser.add_argument("--require-no-deps", nargs="*", default=[],
                        help="requirements the directory must hold, without their dependencies")
    parser.add_argument("--offline", action="store_true",
                        help="the directory must hold every requirement and dependency")
    parser.add_argument("--index-url")
    parser.add_argument("--no-binary", action="append", default=[],
                        help="a project to build from source here (mpi4py: against this "
                             "machine's MPICH)")
    parser.add_argument("--prune", action="store_true")
    parser.add_argument("--check", action="store_true", help="report, write nothing")
    args = parser.parse_args()

    if not args.check:
        args.wheel_dir.mkdir(parents=True, exist_ok=True)
    result = {"changed": False, "wheel": "", "downloaded": False, "pruned": [],
              "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}
    requirement = args.hypertf
    if args.source:
        result["wheel"], result["changed"] = build(args.source, args.wheel_dir,
                                                   not args.no_build_isolation, args.check)
        extras = f"[{args.extras}]" if args.extras else ""
        requirement = f"hypertf{extras}==" + result["wheel"].split("-")[1]
    result["requirement"] = requirement
    if args.offline and args.wheel_dir.is_dir():
        requirements = [requirement, *args.require]
        marker = args.wheel_dir / RESOLVED
        no_deps = [f"--no-deps:{item}" for item in args.require_no_deps]
        # HyperTF's dependencies may change under the same version: key on the wheel's bytes.
        wheel_hash = ([hashlib.sha256((args.wheel_dir / result["wheel"]).read_bytes())
                       .hexdigest()] if result["wheel"] and not args.check else [])
        key = requirements + no_deps + wheel_hash + [f"--no-binary:{p}" for p in args.no_binary]
        if not resolved_already(marker, key):
            index = ["--index-url", args.index_url] if args.index_url else []
            result["downloaded"] = fill(args.wheel_dir, requirements, index, args.check,
                                        args.no_binary)
            if args.require_no_deps:
                result["downloaded"] |= fill(args.wheel_dir, ["--no-deps", *args.require_no_deps],
                                             index, args.check)
            if args.prune and not (args.check and result["downloaded"]):
                result["pruned"] = prune(args.wheel_dir, requirements, args.check)
            if not args.check:
                write_marker(marker, key)
        result["changed"] = bool(result["changed"] or result["downloaded"] or result["pruned"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()

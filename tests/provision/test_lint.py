"""The Ansible content is lint-clean: yamllint and ansible-lint (production profile)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ANSIBLE_PATHS = ["roles", "playbooks", "deploy.yml", ".yamllint", ".ansible-lint"]


def test_yamllint_is_clean():
    done = subprocess.run([str(BIN / "yamllint"), "--strict", *ANSIBLE_PATHS], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ansible_lint_is_clean(tmp_path):
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1",
           "ANSIBLE_HOME": str(tmp_path / "ansible")}
    done = subprocess.run([str(BIN / "ansible-lint", ), "--nocolor"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    assert "Profile 'production' was required, and it passed" in done.stdout + done.stderr

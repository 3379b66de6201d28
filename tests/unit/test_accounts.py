"""Per-user accounts without a lab: the admin's mapping, what a node believes of its
``accounts.json`` and whom its tasknode lets start a job, and the admin's register."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess

import pytest

from hypertf.core.accounts import AccountMode, AccountPolicy
from hypertf.core.errors import UsageError
from hypertf.node import taskaccount
from hypertf.ops import accounts

ME = pwd.getpwuid(os.geteuid()).pw_name
MANAGED = AccountPolicy(AccountMode.MANAGED, "htf-", {"carol": "csmith"}, ())


def test_the_mapping_is_prefix_and_name_unless_the_admin_names_one():
    assert MANAGED.account_of("alice") == "htf-alice"
    assert MANAGED.account_of("carol") == "csmith"
    assert not AccountPolicy().per_user and MANAGED.per_user
    assert AccountPolicy.from_json(MANAGED.to_json()) == MANAGED
    assert "hypertf_account_names" in (MANAGED.problem("Bob.Smith") or "")


@pytest.mark.parametrize("text", ["[]", '{"format": 2}', '{"format": 1, "mode": "x"}',
                                  '{"format": 1, "mode": "managed", "names": [1]}'])
def test_a_damaged_mapping_is_refused(text):
    with pytest.raises((ValueError, KeyError)):
        AccountPolicy.from_json(text)


def test_a_node_without_a_mapping_is_shared_and_lets_anyone_start(tmp_path):
    assert taskaccount.read_policy(tmp_path) == AccountPolicy()
    assert taskaccount.start_problem(tmp_path, "20261201-000000-abcdef.alice") is None
    assert taskaccount.expected_uid(tmp_path, "20261201-000000-abcdef.alice") is None


def test_only_the_owners_account_starts_and_root_only_when_allowed(tmp_path):
    key = "20261201-000000-abcdef.alice"
    taskaccount.write_policy(tmp_path, AccountPolicy(AccountMode.MANAGED, "", {}, ()))
    assert stat.S_IMODE((tmp_path / "accounts.json").stat().st_mode) == 0o644
    assert "no account 'alice'" in (taskaccount.start_problem(tmp_path, key) or "")
    # alice is this test's own account: root, refused unless the admin allows it
    mine = AccountPolicy(AccountMode.MANAGED, "", {"alice": ME}, ())
    taskaccount.write_policy(tmp_path, mine)
    if os.geteuid() == 0:
        assert "root" in (taskaccount.start_problem(tmp_path, key) or "")
        taskaccount.write_policy(tmp_path, mine._replace(root_users=("alice",)))
    assert taskaccount.start_problem(tmp_path, key) is None
    assert taskaccount.expected_uid(tmp_path, key) == os.geteuid()
    assert "no account 'bob'" in (taskaccount.start_problem(tmp_path, key.replace("alice",
                                                                                  "bob")) or "")
    assert taskaccount.expected_uid(tmp_path, "not-a-key") == -1


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_mapping_someone_else_wrote_is_not_believed(tmp_path):
    taskaccount.write_policy(tmp_path, AccountPolicy())
    os.chown(tmp_path / "accounts.json", 65534, 65534)
    found = taskaccount.read_policy(tmp_path)
    assert isinstance(found, str) and "not the agent's" in found
    assert "cannot be read" in (taskaccount.start_problem(tmp_path, "2026-x.alice") or "")
    assert taskaccount.expected_uid(tmp_path, "2026-x.alice") == -1


def test_the_shared_folders_are_sticky_on_a_per_user_node(tmp_path):
    taskaccount.publish(tmp_path, MANAGED)
    for name in ("runs", "checkpoints", "tensorboard"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o1777
    other = tmp_path / "shared"
    taskaccount.publish(other, AccountPolicy())
    assert not (other / "runs").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the check is for non-root task accounts")
def test_the_preflight_names_node_credentials_a_task_account_could_read(tmp_path):
    folder = tmp_path / "credentials"
    folder.mkdir(mode=0o755)
    (folder / "agent.h1.yml").write_text("secret: x\n")
    (folder / "agent.h1.yml").chmod(0o644)
    tmp_path.chmod(0o755)
    code = ("import sys; from hypertf.node import taskaccount; "
            "print(taskaccount.secret_problems(sys.argv[1]))")
    import sys

    try:
        seen = subprocess.run([sys.executable, "-c", code, str(tmp_path)],
                              capture_output=True, text=True, user=65534, group=65534,
                              extra_groups=[], cwd="/", timeout=60,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    except PermissionError as err:  # a Python under a closed home (pyenv in /root)
        pytest.skip(f"this Python is not runnable by nobody: {err}")
    if seen.returncode != 0:
        pytest.skip(f"this Python is not runnable by nobody: {seen.stderr[-200:]}")
    assert "agent.h1.yml" in seen.stdout and "chmod 600" in seen.stdout
    (folder / "agent.h1.yml").chmod(0o600)
    again = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                           text=True, user=65534, group=65534, extra_groups=[], cwd="/",
                           timeout=60)
    assert again.stdout.strip() == "[]"


def test_the_register_gives_each_user_one_uid_and_their_key(tmp_path):
    (tmp_path / "user.alice.yml").write_text("x")
    (tmp_path / "user.bob.yml").write_text("x")
    pub = tmp_path / "bob.pub"
    pub.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB bob@laptop\n")
    alice, made = accounts.register(tmp_path, MANAGED, "alice")
    assert alice.uid == accounts.UID_BASE and alice.account == "htf-alice"
    assert made is not None and stat.S_IMODE(made.stat().st_mode) == 0o600
    assert alice.public_key.startswith("ssh-ed25519 ")
    bob, made = accounts.register(tmp_path, MANAGED, "bob", pub)
    assert bob.uid == accounts.UID_BASE + 1 and made is None
    assert accounts.register(tmp_path, MANAGED, "alice")[0].uid == alice.uid  # kept
    listed = {a.user: a for a in accounts.registered(tmp_path, MANAGED)}
    assert listed["bob"].public_key == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB bob@laptop"
    assert stat.S_IMODE((tmp_path / accounts.REGISTRY).stat().st_mode) == 0o600
    with pytest.raises(UsageError, match="not an OpenSSH public key"):
        accounts.register(tmp_path, MANAGED, "carol", made or tmp_path / "user.alice.ssh")
    with pytest.raises(UsageError, match="taken"):
        accounts.register(tmp_path, MANAGED, "dave", None, alice.uid)
    existing = AccountPolicy(AccountMode.EXISTING)
    assert {a.uid for a in accounts.registered(tmp_path, existing)} == {None}

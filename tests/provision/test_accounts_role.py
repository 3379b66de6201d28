"""``hypertf auth add-user`` on a managed cluster: the user's account made on the nodes by
the user_accounts role (real Ansible over SSH to a bare lab host), with the registered uid
and the key made for the user, and only that key lets the user in."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.launch.remote import Session
from hypertf.ops import accounts
from hypertf.store import credentials
from tests.conftest import on_host

pytestmark = pytest.mark.lab


def test_add_user_makes_the_account_on_every_node_with_its_own_key(make_lab, tmp_path):
    lab = make_lab(hosts=1, zookeeper=True)
    account = f"{lab.account_prefix}erin"
    # the accounts the role makes (erin's, and this test's own user's, registered by the
    # lab's 'auth init'), with uids no other lab on this machine picks, removed with the lab
    own = credentials.job_owner()
    lab.accounts += [account, f"{lab.account_prefix}{own}"]
    lab.save()
    data = yaml.safe_load(Path(lab.inventory).read_text())
    data["all"]["vars"].update({"hypertf_user_accounts": "managed",
                                "hypertf_account_prefix": lab.account_prefix})
    inventory = tmp_path / "managed.yml"
    inventory.write_text(yaml.safe_dump(data))
    uid = random.randint(25000, 29000)
    cluster = load_inventory(str(inventory)).cluster
    accounts.register(store.credentials_dir(cluster), cluster.account_policy, own, None,
                      uid + 1)
    done = subprocess.run([sys.executable, "-m", "hypertf.cli", "auth", "add-user", "erin",
                           "--uid", str(uid), "-i", str(inventory)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "HYPERTF_ZK_IDENTITY": "admin"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"run as the account {account} (uid {uid} on every node)" in done.stdout
    assert "user.erin.ssh" in done.stdout  # the private key to hand over
    assert on_host(str(inventory), "h1", f"id -u {account}").strip() == str(uid)
    assert "hidepid=2" in on_host(str(inventory), "h1", "findmnt -no OPTIONS /proc") or \
        "hidepid=invisible" in on_host(str(inventory), "h1", "findmnt -no OPTIONS /proc")
    listed = subprocess.run([sys.executable, "-m", "hypertf.cli", "auth", "accounts", "-i",
                             str(inventory)], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert listed.returncode == 0 and account in listed.stdout, listed

    # erin's own key logs in as her account, and as nobody else
    inv = load_inventory(str(inventory))
    key = str(lab.dir / "credentials" / "user.erin.ssh")
    node = inv.node("h1")
    session = Session(dataclasses.replace(node, user=account, key_file=key), inv.cluster)
    try:
        assert session.run("id -un").stdout.strip() == account
    finally:
        session.close()
    session = Session(dataclasses.replace(node, key_file=key), inv.cluster)  # as root
    with pytest.raises(Exception, match="refused the key"):
        session.run("true")
    session.close()

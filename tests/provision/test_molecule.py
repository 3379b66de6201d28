"""``molecule test`` of every role (syntax, converge, idempotence, verify) on bare lab hosts."""

from __future__ import annotations

import pytest

from tests.provision.conftest import molecule

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]


def test_ssh_access_makes_a_key_pins_host_keys_and_authorizes_it(make_lab, lab_inventory,
                                                                  ansible_dirs):
    """First contact with the lab's key; the role makes a new operator key, pins both host
    keys in an empty known_hosts and authorizes the key (verify logs in with it alone)."""
    lab = make_lab(hosts=2)
    operator = lab.dir / "operator"
    inventory = lab_inventory(
        lab.dir, zookeeper=(), venv=None, tensorflow="", operator_dir=operator,
        extra_vars={"ansible_ssh_private_key_file": str(lab.key_file),
                    "ssh_access_key_file": str(operator / "id_ed25519")})
    molecule("ssh_access", inventory, ansible_dirs)
    pinned = sorted((operator / "known_hosts").read_text().splitlines())
    assert pinned == sorted(lab.known_hosts.read_text().splitlines())
    assert (operator / "id_ed25519.pub").read_text().split()[1] in (
        lab.dir / "authorized_keys").read_text()


def test_python_env_installs_hypertf_and_packages_offline(make_lab, lab_inventory, ansible_dirs):
    """With the inventory's packages: tf-keras without its dependencies (its 'tensorflow'
    requirement would pull the full wheel); molecule's idempotence step is the second run
    that must change nothing. TensorFlow itself is left out here: installing it takes most
    of a minute of CPU, and test_setup's bare hosts install it (and train with it).
    ``hypertf_offload: true``: MPICH and the offload extra, mpi4py built from source on this
    machine into the wheel directory (verify runs mpiexec and imports the hook and mpi4py,
    which must report MPICH)."""
    from importlib.metadata import version

    lab = make_lab(hosts=1)
    tf_keras = f"tf-keras=={version('tensorflow-cpu')}"
    inventory = lab_inventory(lab.dir, zookeeper=(), tensorflow="",
                              extra_vars={"hypertf_python_packages": ["scikit-learn"],
                                          "hypertf_python_packages_no_deps": [tf_keras],
                                          "hypertf_offload": True})
    molecule("python_env", inventory, ansible_dirs)
    venv = lab.dir / "h1" / "srv" / "hypertf" / "venv"
    assert (venv / "bin" / "hypertf").exists()
    site = next((venv / "lib").glob("python3.*/site-packages"))
    assert list(site.glob("tf_keras-*.dist-info")), "tf-keras was not installed"
    assert not list(site.glob("tensorflow-*.dist-info")), "the full tensorflow wheel came in"
    (mpi4py,) = site.glob("mpi4py-*.dist-info")
    assert "Tag: cp3" in (mpi4py / "WHEEL").read_text() and "manylinux" not in (
        mpi4py / "WHEEL").read_text(), "mpi4py came from PyPI's wheel, not built here"


def test_offload_trust_lets_nodes_start_mpichs_proxy_on_each_other_and_nothing_else(
        make_lab, lab_inventory, ansible_dirs):
    """``hypertf_offload: true`` on two bare hosts, each with a home of its own: verify logs
    in from each to the other with the cluster key (a plain command refused by the gate, and
    logged) and runs hydra's mpiexec across both. No private key of this machine's reached
    a host: the one private key in their homes is the cluster key."""
    lab = make_lab(hosts=2)
    inventory = lab_inventory(lab.dir, zookeeper=(), venv=None, tensorflow="",
                              extra_vars={"hypertf_offload": True})
    molecule("offload_trust", inventory, ansible_dirs)
    cluster_key = lab.dir / "hypertf_offload_ed25519"
    assert cluster_key.stat().st_mode & 0o777 == 0o600
    for host in ("h1", "h2"):
        ssh = lab.dir / host / "home" / ".ssh"
        assert (ssh / "hypertf_offload_ed25519").read_bytes() == cluster_key.read_bytes()
        private = [p.name for p in ssh.iterdir() if "PRIVATE KEY" in p.read_text()]
        assert private == ["hypertf_offload_ed25519"], private
        (line,) = [x for x in (ssh / "authorized_keys").read_text().splitlines() if x]
        assert line.startswith('command="') and '",restrict ssh-ed25519 ' in line
        assert sorted((ssh / "hypertf_offload_known_hosts").read_text().splitlines()) == \
            sorted(lab.known_hosts.read_text().splitlines())


def test_zookeeper_standalone(make_lab, lab_inventory, ansible_dirs):
    lab = make_lab(hosts=1)
    inventory = lab_inventory(lab.dir, zookeeper=("h1",), tensorflow="")
    molecule("zookeeper", inventory, ansible_dirs)


def test_hypertf_agent_registers_every_node(make_lab, lab_inventory, ansible_dirs):
    """The lab's own ZooKeeper and the machine's virtualenv: only the agent role runs."""
    lab = make_lab(hosts=2, zookeeper=True)
    inventory = lab_inventory(lab.dir, zookeeper=(), venv=None, tensorflow="")
    molecule("hypertf_agent", inventory, ansible_dirs)

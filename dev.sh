#!/usr/bin/env bash
# HyperTF on this machine, from a fresh clone:
#   ./dev.sh up     install what the main job needs (ZooKeeper, .venv with the controller and
#                   TensorFlow, the examples' packages), start a local ZooKeeper and agent, show
#                   the cluster, and train an example through `invoke train` (CPU without a GPU)
#   ./dev.sh test   install everything the suite needs too (the lab's sshd and namespaces,
#                   MPICH and mpi4py for the offload, Chromium for the dashboard, JAX for
#                   the Keras 3 and JAX examples, the dev extra), then run the whole test
#                   suite (lint included)
# Needs: Debian/Ubuntu, root (apt; network namespaces for the lab), Python >= 3.10.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
# What `up` needs: ZooKeeper (the local node runs its agent and tasks without SSH) and a JDK
# (javac builds HyperTF's bounds provider for it: hypertf/ops/zkbounds.py).
UP_SYSTEM_PACKAGES=(zookeeper default-jdk-headless)
UP_EXTRAS=controller,tf
# What the suite needs on top: sshd, ip netns and openssl (the lab, test_auth), acl (a per-user
# lab lets its accounts through a closed home to this Python: setfacl), pdsh (bench),
# Chromium with its driver (tests/launcher/test_dashboard.py), MPICH (offload: mpiexec, and
# the headers mpi4py is built against).
TEST_SYSTEM_PACKAGES=("${UP_SYSTEM_PACKAGES[@]}" openssh-server openssh-client iproute2 pdsh
                      openssl acl chromium chromium-driver mpich libmpich-dev)
TEST_EXTRAS=$UP_EXTRAS,offload,jax,dev

install_system() {  # the Debian packages named as arguments, those not installed yet
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        echo "== apt-get install ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

install_python() {  # hypertf with the extras named ("controller,tf"), editable, in .venv
    if [ ! -x .venv/bin/python ]; then
        echo "== creating .venv with $($PYTHON --version)"
        "$PYTHON" -m venv .venv
    fi
    echo "== pip install -e .[$1]"
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
    # mpi4py (the offload extra) from source against Debian's MPICH: its binary wheel loads
    # libmpi.so.12, which Debian names libmpich.so.12 (pip keeps the built wheel in its cache:
    # built once). The flag is harmless where the extras name no mpi4py.
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-binary mpi4py \
        -e ".[$1]"
    # Keras 2 for examples/keras_fit.py: tf-keras of TensorFlow's minor version, without its
    # dependencies (it requires "tensorflow", which would pull the full wheel over -cpu).
    local tf
    tf=$(.venv/bin/python -c "from importlib.metadata import version as v; print('.'.join(v('tensorflow-cpu').split('.')[:2]))")
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
        "tf-keras>=$tf,<${tf%.*}.$(( ${tf#*.} + 1 ))"
    # The package's bytecode, as pip writes it for an installed package: every launcher and
    # every node's 'tasknode' is a new Python, and where PYTHONDONTWRITEBYTECODE is set an
    # editable install would compile ~90 modules on each start (~25 ms of a launch).
    PYTHONDONTWRITEBYTECODE= .venv/bin/python -m compileall -q hypertf >/dev/null
}

case "${1:-}" in
    up)
        install_system "${UP_SYSTEM_PACKAGES[@]}"
        install_python "$UP_EXTRAS"
        # the packages inventory/local.yml names for the scripts (hypertf_python_packages...)
        .venv/bin/hypertf cluster local-packages -i inventory/local.yml
        .venv/bin/invoke zk.start
        .venv/bin/invoke agent.start
        sleep 1
        .venv/bin/invoke cluster.status
        .venv/bin/invoke train --script examples/mirrored_strategy.py --worker 2 \
            -- --batch_size 64 --learning_rate 0.01
        .venv/bin/invoke cluster.status
        ;;
    test)
        install_system "${TEST_SYSTEM_PACKAGES[@]}"
        install_python "$TEST_EXTRAS"
        echo "== ruff"
        .venv/bin/ruff check hypertf tests tasks.py examples bench
        echo "== import contracts (pyproject.toml [tool.importlinter])"
        .venv/bin/lint-imports --no-cache
        echo "== types (pyproject.toml [tool.mypy]: the whole package, strictly)"
        .venv/bin/mypy
        # Independent tests in parallel processes, each with its own ZooKeeper and lab
        # (tests/conftest.py); most of the suite waits on processes, sshd and ZooKeeper, not
        # on the CPU. HYPERTF_TEST_WORKERS=0 runs it in this process.
        workers=${HYPERTF_TEST_WORKERS:-3}
        echo "== pytest ($workers workers)"
        set +e
        .venv/bin/python -m pytest -n "$workers" --dist load "${@:2}"
        code=$?
        set -e
        if [ "$code" -eq 5 ]; then
            echo "pytest collected no test: failing" >&2
            exit 1
        fi
        exit "$code"
        ;;
    *)
        echo "usage: ./dev.sh up | ./dev.sh test [pytest args]" >&2
        exit 2
        ;;
esac

"""``hypertf train --detach``: the job goes on in a background launcher of its own.

The foreground checks what it can (the request, the inventory), picks the task key, starts
``python -m hypertf.launch.detach`` in a new session (no terminal: a logout's SIGHUP does not reach
it) with its output in ``runs/<key>/launcher.log``, waits until the job's record exists in
ZooKeeper (queued or allocated) so that ``hypertf cancel KEY`` works at once, prints the key
and returns. The background launcher is an ordinary one: it waits in the queue, runs the job
and cleans up; killed outright, its lease expires and the agents clean up as for any job.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.core.errors import HyperTFError, UsageError, say_interrupted
from hypertf.core.placement import new_task_key
from hypertf.core.rundir import RunDir, make_private, write_private
from hypertf.launch.request import TrainRequest
from hypertf.store import credentials

ENV_ON_STDIN = "--env-on-stdin"  # the --env values come on stdin (hand_env), not in a file
REGISTERED_WITHIN_S = 120.0  # preflight and the first allocation try come before the record


def request_file(run: Path) -> Path:
    return run / "request.json"


def start_detached(inventory: str, request: TrainRequest) -> int:
    request.validate()
    inv = load_inventory(inventory)  # a broken inventory fails here, in the foreground
    key = new_task_key(credentials.job_owner())
    run = make_private(RunDir.of(".", key, local=True).local)
    write_private(request_file(run), json.dumps(request.without_env_values().to_json()))
    log_path = run / "launcher.log"
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "hypertf.launch.detach", str(inv.path), str(request_file(run)),
             key, ENV_ON_STDIN],
            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=os.getcwd())
    hand_env(launcher, request.env_vars())
    client = store.connect(inv.cluster, long_lived=True)
    try:
        zk = store.Store(client, store.Layout(inv.cluster.zk_root))
        deadline = time.monotonic() + REGISTERED_WITHIN_S
        while zk.jobs.read(key) is None:
            if launcher.poll() is not None:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
                print("\n".join(tail), file=sys.stderr)
                return launcher.returncode or 1
            if time.monotonic() > deadline:
                break  # still preflighting: it goes on; say where to look
            time.sleep(0.2)
    finally:
        store.close(client)
    print(key)
    print(f"hypertf: job {key} detached (launcher PID {launcher.pid}, output {log_path}); "
          f"follow: hypertf logs {key} -f; queue: hypertf queue; end: hypertf cancel {key}",
          file=sys.stderr)
    return 0


def hand_env(launcher: subprocess.Popen[bytes], values: dict[str, str]) -> None:
    """The --env values, through the background launcher's stdin: never on its command line
    (``/proc/<pid>/cmdline`` is world-readable) nor in ``request.json``."""
    assert launcher.stdin is not None
    with contextlib.suppress(BrokenPipeError), launcher.stdin:
        launcher.stdin.write(json.dumps(values).encode())


def env_from_stdin() -> dict[str, str]:
    """What ``hand_env`` sent: NAME -> value."""
    values = json.loads(sys.stdin.buffer.read() or b"{}")
    sys.stdin.close()
    if not isinstance(values, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        raise UsageError("the detached launcher's --env values are not a mapping of text")
    return values


def main(argv: list[str]) -> int:
    """The background launcher: ``python -m hypertf.launch.detach INVENTORY REQUEST.json KEY
    [--env-on-stdin]`` (a detached job's, and each trial's of a sweep)."""
    from hypertf.launch.exits import quiet_kazoo, run
    from hypertf.launch.launcher import train

    inventory, request_path, key, *flags = argv
    request = TrainRequest.from_json(json.loads(Path(request_path).read_text()))
    if ENV_ON_STDIN in flags:
        request = request.with_env(env_from_stdin())
    quiet_kazoo()
    print(f"hypertf: detached launcher of job {key} (PID {os.getpid()})", flush=True)

    def job() -> int:
        train(load_inventory(inventory), request, say=lambda line: print(line, flush=True),
              first_key=key)
        return 0

    return run(job)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except HyperTFError as err:  # pragma: no cover - exits.run reports these
        print(f"hypertf: error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:  # Ctrl-C among the imports, before exits.run: no job yet
        sys.exit(say_interrupted())  # (a sweep's trial: cancelled, not lost)

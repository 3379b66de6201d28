"""Launch fan-out: time from the command to every task started (running, port listening).

For N = 1, 2, 4, 8 lab hosts, one trivial task per host (tests/scripts/fake_tf.py: reads
TF_CONFIG, listens on its port, then sleeps) started three ways, side by side in one run:

* ``hypertf train -i <inventory of hosts h1..hN> --script fake_tf.py --worker N``
  (preflight, allocation in ZooKeeper, one SSH command per host, a watcher per host);
  stopped with SIGINT once every port listens, then checked: no process left, GPUs free;
* ``pdsh -R ssh -w <N hosts>`` running the same task detached on every host;
* a plain serial ``ssh`` loop doing the same;
* ``hypertf-cold``: ``hypertf train`` with the preflight cache off
  (``HYPERTF_PREFLIGHT_CACHE_S=0``): every run preflights its hosts over SSH first, as a
  first job on a cluster (or one more than 2 minutes after the last) does;
* ``hypertf-warm``: ``hypertf train`` through the user's warm launcher
  (``HYPERTF_WARM_S``, hypertf.cli.warm): a fork of a process with the launcher's modules
  imported, started once before the runs (``warm_up``) and stopped after them.

Then a whole short job (``--short``, on by default): 4 workers (2 with ``--quick``), one per
host, that listen and exit at once (``fake_tf.py --work_s 0``), through ``hypertf train``
(from the command to its exit: admission, start, watch, stop, release, logs and summary
included) beside the same processes started by ``ssh`` in parallel and waited for.

Every method is timed the same way: from just before the command starts to the moment this
machine can connect to every task's port (polled every 5 ms). Both baselines use the lab
key and its pinned known_hosts with strict host key checking. The launcher also prints its
own "all N tasks listening" line (its watcher polls every 0.2 s); that time is reported too.
One lab of max(N) hosts serves every N; the launcher gets an inventory of the first N hosts.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import common
import yaml

from hypertf import store

WORK_S = 600  # the task sleeps this long: it must outlive the measurement
WARM_S = 600  # hypertf-warm: the warm launcher's idle life (stopped at the end anyway)


def sub_inventory(lab, count: int) -> str:
    """The lab's inventory restricted to hosts h1..h<count> (same ZooKeeper, same agents)."""
    data = yaml.safe_load(Path(lab.inventory).read_text())
    hosts = data["all"]["children"]["gpu_nodes"]["hosts"]
    keep = {h.name for h in lab.hosts[:count]}
    data["all"]["children"]["gpu_nodes"]["hosts"] = {k: v for k, v in hosts.items() if k in keep}
    path = Path(lab.directory) / f"inventory-{count}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def ssh_config(lab, home: Path) -> Path:
    """OpenSSH settings equal to the launcher's: lab key only, pinned host keys, strict."""
    path = home / "ssh_config"
    path.write_text(
        "Host *\n"
        "  User root\n"
        f"  IdentityFile {lab.key_file}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {lab.known_hosts}\n"
        "  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n"
        "  ControlMaster no\n"
        "  ConnectTimeout 5\n"
    )
    return path


def task_command(lab, count: int, port: int, tag: str) -> str:
    """One shell command for every host: it finds its own index from its hostname."""
    hosts = lab.hosts[:count]
    workers = json.dumps([f"{h.address}:{port}" for h in hosts])
    cases = " ".join(f"{h.name}) i={n};;" for n, h in enumerate(hosts))
    config = ('{"cluster":{"worker":' + workers + '},"task":{"type":"worker","index":\'$i\'}}')
    return (
        f"mkdir -p /srv/bench && cd /srv/bench && case $(hostname) in {cases} esac && "
        f"{{ BENCH_TAG={tag} TF_CONFIG='{config}' setsid nohup {common.PYTHON} {common.FAKE_TF} "
        f"--work_s {WORK_S} > /srv/bench/{tag}.log 2>&1 < /dev/null & "
        f"echo $! > /srv/bench/{tag}.pid; }}"
    )


def stop_command(tag: str) -> str:
    return (f"test -f /srv/bench/{tag}.pid && kill -TERM -- -$(cat /srv/bench/{tag}.pid) "
            f"2>/dev/null; rm -f /srv/bench/{tag}.pid; true")


def pdsh(config: Path, addresses: list[str], command: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PDSH_SSH_ARGS": f"-F {config} %h"}
    return subprocess.run(["pdsh", "-R", "ssh", "-f", "32", "-w", ",".join(addresses), command],
                          env=env, capture_output=True, text=True, timeout=120)


def serial_ssh(config: Path, addresses: list[str], command: str) -> None:
    for address in addresses:
        done = subprocess.run(["ssh", "-F", str(config), address, command],
                              capture_output=True, text=True, timeout=60)
        if done.returncode:
            raise RuntimeError(f"ssh {address} failed: {done.stderr.strip()}")


def run_baseline(method: str, lab, config: Path, count: int, port: int, tag: str) -> dict:
    addresses = [h.address for h in lab.hosts[:count]]
    endpoints = [(a, port) for a in addresses]
    command = task_command(lab, count, port, tag)
    started = time.monotonic()
    try:
        if method == "pdsh":
            done = pdsh(config, addresses, command)
            if done.returncode:
                raise RuntimeError(f"pdsh failed ({done.returncode}): {done.stderr.strip()}")
        else:
            serial_ssh(config, addresses, command)
        returned = time.monotonic()
        listening = common.wait_listening(endpoints, 60, f"{method} tasks to listen")
    finally:
        pdsh(config, addresses, stop_command(tag))
        common.wait_until(lambda: not common.processes_with_env("BENCH_TAG", tag), 30,
                          f"{method} tasks to stop")
    return {"listen_s": listening - started, "returned_s": returned - started}


PHASES = ("connect", "preflight", "admission", "start", "listening", "stop", "release", "logs")


def phases(cwd: Path) -> dict[str, float]:
    """From the job's summary.json timeline: per phase, its longest host's seconds (for the
    instants such as 'listening', the last one's time since the job's start)."""
    found: dict[str, float] = {}
    for summary in cwd.glob("runs/*/summary.json"):
        for entry in json.loads(summary.read_text()).get("timeline", []):
            value = entry["seconds"] or (entry["start_s"] if entry["phase"] == "listening"
                                         else 0.0)
            found[entry["phase"]] = max(found.get(entry["phase"], 0.0), value)
    return found


def method_env(method: str) -> dict[str, str]:
    """``hypertf-cold``: the preflight cache off; ``hypertf-warm``: through the warm launcher
    (``HYPERTF_WARM_S``, started by ``warm_up`` before the runs); else as it is."""
    extra = {"hypertf-cold": {"HYPERTF_PREFLIGHT_CACHE_S": "0"},
             "hypertf-warm": {"HYPERTF_WARM_S": str(WARM_S)}}.get(method, {})
    return {**{k: v for k, v in os.environ.items() if k != "HYPERTF_WARM_S"}, **extra}


def warm_up(inventory: str, cwd: Path) -> None:
    """Start the warm launcher: one short job with HYPERTF_WARM_S runs cold and starts it,
    then wait until it listens."""
    cwd.mkdir()
    subprocess.run([common.PYTHON, "-m", "hypertf.cli", "train", "-i", inventory, "--script",
                    common.FAKE_TF, "--worker", "1", "--", "--work_s", "0"], cwd=cwd,
                   env=method_env("hypertf-warm"), capture_output=True, timeout=120, check=True)
    common.wait_until(lambda: "warm launcher " in warm_cli("status"), 60,
                      "the warm launcher to listen")


def warm_cli(verb: str) -> str:
    return subprocess.run([common.PYTHON, "-m", "hypertf.cli", "warm", verb],
                          capture_output=True, text=True, timeout=60, check=True).stdout


def run_ours(kids: common.Children, lab, inventory: str, count: int, cwd: Path,
             client, method: str = "hypertf") -> dict:
    """hypertf train until every port listens, then SIGINT; check it left nothing."""
    lines: queue.Queue[tuple[float, str]] = queue.Queue()
    started = time.monotonic()
    proc = kids.popen([common.PYTHON, "-m", "hypertf.cli", "train", "-i", inventory,
                       "--script", common.FAKE_TF, "--worker", str(count),
                       "--start-timeout", "60", "--", "--work_s", str(WORK_S)],
                      cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                      env=method_env(method))

    def read() -> None:
        for line in proc.stdout:
            lines.put((time.monotonic(), line.rstrip("\n")))
        lines.put((time.monotonic(), ""))

    threading.Thread(target=read, daemon=True).start()
    output: list[str] = []

    def next_line(deadline: float) -> tuple[float, str]:
        stamp, line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        output.append(line)
        if not line and proc.poll() is not None:
            raise RuntimeError("hypertf train ended early:\n" + "\n".join(output[-20:]))
        return stamp, line

    deadline = time.monotonic() + 90
    parsed = None
    while parsed is None:
        stamp, line = next_line(deadline)
        parsed = common.parse_started(line)
    started_line = stamp
    key, tasks = parsed
    addresses = {h.name: h.address for h in lab.hosts}
    endpoints = [(addresses[host], port) for host, port in tasks.values()]
    listening = common.wait_listening(endpoints, 60, "hypertf tasks to listen")
    while "tasks listening after" not in line:
        stamp, line = next_line(deadline)
    announced = stamp
    interrupted = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    exited = time.monotonic()
    with contextlib.suppress(queue.Empty):
        while True:
            output.append(lines.get(timeout=1)[1])
    if proc.returncode != 130:
        raise RuntimeError(f"hypertf train exited {proc.returncode} on SIGINT, not 130:\n"
                           + "\n".join(output[-20:]))
    left = common.remote_processes(inventory, key)
    held = common.job_cells(client, common.inventory_of(inventory).cluster.zk_root, key)
    if left or held:
        raise RuntimeError(f"job {key} left processes {left} / {held} matrix cells behind")
    return {"listen_s": listening - started, "started_line_s": started_line - started,
            "announced_s": announced - started, "stop_s": exited - interrupted,
            **{f"phase {k}": v for k, v in phases(cwd).items() if k in PHASES}}


def short_ours(kids: common.Children, inventory: str, count: int, cwd: Path,
               method: str = "hypertf") -> dict:
    """A whole job of ``count`` workers that listen and exit: command to exit (0)."""
    started = time.monotonic()
    proc = kids.popen([common.PYTHON, "-m", "hypertf.cli", "train", "-i", inventory,
                       "--script", common.FAKE_TF, "--worker", str(count), "--", "--work_s",
                       "0"], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                      text=True, env=method_env(method))
    output, _ = proc.communicate(timeout=120)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"the short job exited {proc.returncode}:\n{output[-2000:]}")
    return {"wall_s": wall, **{f"phase {k}": v for k, v in phases(cwd).items()
                               if k in PHASES}}


def short_ssh(lab, config: Path, count: int, port: int, tag: str) -> dict:
    """The same workers started by ssh in parallel (one per host) and waited for."""
    hosts = lab.hosts[:count]
    workers = [f"{h.address}:{port}" for h in hosts]
    started = time.monotonic()
    procs = []
    for index, host in enumerate(hosts):
        tf_config = json.dumps({"cluster": {"worker": workers},
                                "task": {"type": "worker", "index": index}})
        command = (f"mkdir -p /srv/bench && cd /srv/bench && BENCH_TAG={tag} "
                   f"TF_CONFIG={shlex.quote(tf_config)} {common.PYTHON} {common.FAKE_TF} "
                   f"--work_s 0 > /srv/bench/{tag}-{index}.log 2>&1 < /dev/null")
        procs.append(subprocess.Popen(["ssh", "-F", str(config), host.address, command],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        if proc.returncode:
            raise RuntimeError(f"ssh worker failed ({proc.returncode}): {err.decode()}")
    return {"wall_s": time.monotonic() - started}


def main() -> int:
    parser = common.parser(__doc__.splitlines()[0])
    parser.add_argument("--no-warm", action="store_true",
                        help="leave out hypertf-warm (for code that predates the warm launcher)")
    parser.add_argument("--per-user", action="store_true",
                        help="a per-user lab: the launcher logs in as the user's own account "
                             "with its own key, its tasks run as it (hypertf_user_accounts)")
    args = parser.parse_args()
    sizes = [1, 2] if args.quick else [1, 2, 4, 8]
    reps = 1 if args.quick else 3
    report = common.Report("launch_fanout", args)
    report.start()
    results: dict[tuple[str, int], list[dict]] = {}
    with common.bench_home("fanout") as home, \
            common.lab(home, max(sizes), 1, args.per_user) as lab, \
            common.children() as kids:
        config = ssh_config(lab, home)
        inventories = {n: sub_inventory(lab, n) for n in sizes}
        for path in [lab.inventory, *inventories.values()]:
            common.inventory_of(str(path))  # read once, before any run (inventory_of)
        client = store.connect(common.inventory_of(str(lab.inventory)).cluster)
        try:
            if not args.no_warm:
                warm_up(inventories[1], home / "warm-up")
            port = 22000
            for rep in range(reps):
                for count in sizes:
                    methods = ["hypertf", "pdsh", "ssh", "hypertf-cold", "hypertf-warm"]
                    methods = methods[:4] if args.no_warm else methods
                    methods = methods[rep % len(methods):] + methods[:rep % len(methods)]
                    if count == 1 and max(sizes) > 1 and not args.quick:
                        methods.append("hypertf-full-inventory")
                    for method in methods:
                        port += 1
                        if method.startswith("hypertf"):
                            inventory = (lab.inventory if method.endswith("inventory")
                                         else inventories[count])
                            cwd = home / f"runs-{method}-{count}-{rep}"
                            cwd.mkdir()
                            result = run_ours(kids, lab, inventory, count, cwd, client,
                                              method="hypertf" if method.endswith(
                                                  "inventory") else method)
                        else:
                            result = run_baseline(method, lab, config, count, port,
                                                  f"{method}-{count}-{rep}")
                        results.setdefault((method, count), []).append(result)
                        print(f"  rep {rep + 1} N={count} {method}: "
                              + ", ".join(f"{k} {v:.2f}" for k, v in result.items()),
                              flush=True)
            short = 2 if args.quick else 4
            short_inventory = inventories.get(short) or sub_inventory(lab, short)
            for rep in range(reps):
                methods = ["hypertf", "ssh", "hypertf-cold", "hypertf-warm"]
                methods = methods[:3] if args.no_warm else methods
                for method in methods[rep % len(methods):] + methods[:rep % len(methods)]:
                    port += 1
                    if method == "ssh":
                        result = short_ssh(lab, config, short, port, f"short-{rep}")
                    else:
                        cwd = home / f"short-{method}-{rep}"
                        cwd.mkdir()
                        result = short_ours(kids, short_inventory, short, cwd, method)
                    results.setdefault((f"short {method}", short), []).append(result)
                    print(f"  rep {rep + 1} short job, {short} workers, {method}: "
                          + ", ".join(f"{k} {v:.2f}" for k, v in result.items()), flush=True)
        finally:
            if not args.no_warm:
                warm_cli("stop")
            store.close(client)

    def med(method: str, count: int, key: str = "listen_s") -> float:
        return common.median([r[key] for r in results.get((method, count), [])])

    print()
    # Issue 43 item 3's goals, cold (no resident process): <= 1.0x pdsh with 8 hosts, 1.3x
    # with 1; the warm launcher's rows are judged by the same, for comparison.
    goals = {8: ("<=", 1.0), 1: ("<=", 1.3)}
    for count in sizes:
        ours, pd, ssh = med("hypertf", count), med("pdsh", count), med("ssh", count)
        report.add(f"N={count} hypertf train: command to every port listening", ours, "s",
                   method="hypertf", n=count, samples=[r["listen_s"] for r in
                                                        results[("hypertf", count)]])
        report.add(f"N={count} pdsh -R ssh: command to every port listening", pd, "s",
                   method="pdsh", n=count)
        report.add(f"N={count} serial ssh loop: command to every port listening", ssh, "s",
                   method="ssh", n=count)
        report.add(f"N={count} ratio hypertf/pdsh", common.ratio(ours, pd), "x",
                   goal=goals.get(count))
        report.add(f"N={count} ratio hypertf/serial ssh", common.ratio(ours, ssh), "x")
        report.add(f"N={count} hypertf: command to its 'started N tasks' line",
                   med("hypertf", count, "started_line_s"), "s")
        report.add(f"N={count} hypertf: command to its 'all N tasks listening' line",
                   med("hypertf", count, "announced_s"), "s")
        report.add(f"N={count} hypertf: SIGINT to exit (tasks stopped, GPUs released)",
                   med("hypertf", count, "stop_s"), "s")
        report.add(f"N={count} pdsh: command returned", med("pdsh", count, "returned_s"), "s")
        cold = med("hypertf-cold", count)
        report.add(f"N={count} hypertf, preflight cache off: command to every port listening",
                   cold, "s", method="hypertf-cold", n=count)
        report.add(f"N={count} ratio hypertf (cache off)/pdsh", common.ratio(cold, pd), "x")
        if not args.no_warm:
            warm = med("hypertf-warm", count)
            report.add(f"N={count} hypertf, warm launcher: command to every port listening",
                       warm, "s", method="hypertf-warm", n=count)
            report.add(f"N={count} ratio hypertf (warm launcher)/pdsh", common.ratio(warm, pd),
                       "x", goal=goals.get(count))
        for method in ("hypertf", "hypertf-cold", "hypertf-warm")[:2 if args.no_warm else 3]:
            timeline = ", ".join(
                f"{phase} {med(method, count, f'phase {phase}'):.2f}" for phase in PHASES
                if all(f"phase {phase}" in r for r in results.get((method, count), [])))
            report.add(f"N={count} {method} timeline (s, longest host)", timeline)
    top, low = max(sizes), min(sizes)
    for method in ("hypertf", "pdsh", "ssh"):
        report.add(f"ratio N={top}/N={low} {method}",
                   common.ratio(med(method, top), med(method, low)), "x")
    if ("hypertf-full-inventory", 1) in results:
        full = med("hypertf-full-inventory", 1)
        report.add(f"N=1 hypertf with the whole {top}-host inventory", full, "s")
        report.add(f"ratio N=1 {top}-host inventory / 1-host inventory",
                   common.ratio(full, med("hypertf", 1)), "x")
    short = 2 if args.quick else 4
    ours_short, ssh_short = med("short hypertf", short, "wall_s"), med("short ssh", short, "wall_s")
    cold_short = med("short hypertf-cold", short, "wall_s")
    report.add(f"short job, {short} workers that listen and exit: hypertf train, command to exit",
               ours_short, "s")
    report.add("short job: ssh in parallel, waited for", ssh_short, "s")
    report.add("short job: ratio hypertf/ssh", common.ratio(ours_short, ssh_short), "x",
               goal=("<=", 1.2))
    report.add("short job: hypertf, preflight cache off", cold_short, "s")
    report.add("short job: ratio hypertf (cache off)/ssh", common.ratio(cold_short, ssh_short),
               "x")
    if not args.no_warm:
        warm_short = med("short hypertf-warm", short, "wall_s")
        report.add("short job: hypertf, warm launcher", warm_short, "s")
        report.add("short job: ratio hypertf (warm launcher)/ssh",
                   common.ratio(warm_short, ssh_short), "x", goal=("<=", 1.2))
    for method in ("short hypertf", "short hypertf-cold",
                   "short hypertf-warm")[:2 if args.no_warm else 3]:
        timeline = ", ".join(
            f"{phase} {med(method, short, f'phase {phase}'):.2f}" for phase in PHASES
            if all(f"phase {phase}" in r for r in results.get((method, short), [])))
        report.add(f"{method} timeline (s, longest host)", timeline)
    report.note(f"median of {reps} run(s) each; one lab of {top} hosts x 1 static GPU; every "
                f"hypertf run was stopped with SIGINT, exited 130 and left no process and no "
                f"held GPU or port (checked)")
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

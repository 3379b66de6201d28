"""An attempt's end on its hosts (hypertf.launch.attempt): its tasks stopped, then what they
left brought back (task logs, the metrics file, the offload counts). The attempt keeps the
lifecycle and its state; this is the hosts' side of its last steps, handed only the parts it
talks through (the fleet, the inbox of what the nodes said, where runs live), so the
attempt reads as allocate -> start -> watch -> stop -> release and each side tests alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from hypertf.core.monitor import TaskState
from hypertf.core.preemptnotice import Notice
from hypertf.core.protocol import StopResult
from hypertf.core.rundir import RunDir, make_private
from hypertf.launch.fleet import Fleet
from hypertf.launch.inbox import Inbox
from hypertf.launch.remote import GroupResult
from hypertf.launch.taskstart import reporting_task


def hosts_of(tasks: Mapping[str, TaskState]) -> set[str]:
    """The hosts the tasks were placed on."""
    return {t.placement.host for t in tasks.values()}


class Teardown:
    """Stops an attempt's tasks and collects what they left, on the hosts that answer; the
    tasks, lost hosts and notice are the attempt's, passed in as they stand then."""

    def __init__(self, fleet: Fleet, inbox: Inbox, run_dir: Callable[[str], RunDir],
                 local: RunDir, say: Callable[[str], None]) -> None:
        self.fleet = fleet
        self.inbox = inbox
        self.run_dir = run_dir  # a host's run directory (its workdir, from the inventory)
        self.local = local  # the same layout on this machine: task logs, metrics, summary
        self.say = say

    def stop(self, tasks: Mapping[str, TaskState], lost_hosts: set[str],
             preempted: Notice | None, grace: float) -> GroupResult[dict[str, StopResult]]:
        """TERM each task's process group, KILL after the grace period (the notice's
        deadline when ``preempted``, its file first); every host at once. A host whose node
        ended the run itself needs no stop."""
        if not tasks:
            return GroupResult()
        hosts = sorted(hosts_of(tasks) - lost_hosts)
        for host in sorted(lost_hosts):
            self.say(f"hypertf: warning: {host} does not answer: its agent stops the job's "
                     f"tasks there when it can reach ZooKeeper again (the lease is released)")
        done = self._ended_by_nodes(tasks, hosts)
        runs = {h: self.run_dir(h) for h in hosts if h not in done}
        if preempted is not None:  # the notice's deadline, its file first
            ends = self.fleet.stop(runs, preempted.grace_left(time.time()), preempted.deadline)
        else:
            ends = self.fleet.stop(runs, grace)
        self.inbox.ended.update(ends.succeeded)  # the stop's answer: logs, metrics, offload
        results: GroupResult[dict[str, StopResult]] = GroupResult()
        results.update({host: end.stopped for host, end in ends.succeeded.items()})
        results.update(ends.failed)
        results.update(done)
        for host, value in results.succeeded.items():
            for task in tasks.values():
                if task.placement.host == host and task.file_name in value:
                    task.stop_result = task.stop_result or value[task.file_name]
        for host, err in results.failed.items():
            self.say(f"hypertf: warning: could not stop tasks on {host} ({err}); its "
                     f"agent stops them once the job's lease is released")
        return results

    def _ended_by_nodes(self, tasks: Mapping[str, TaskState], hosts: list[str],
                        ) -> dict[str, dict[str, StopResult]]:
        """Hosts whose every task exited by itself: their watcher ends the run there and
        says so right after the last exit (nothing of it left, logs attached), so they
        need no stop. Waits briefly for that word; a host without it is stopped."""
        finished = {host for host in hosts if all(
            t.ended is not None for t in tasks.values() if t.placement.host == host)}
        return self.inbox.ends_of(finished, tasks)

    def collect(self, tasks: Mapping[str, TaskState], lost_hosts: set[str],
                offload: dict[str, dict[str, Any]] | None) -> None:
        """Every task's log into the local copy of the run (hosts that answer; the stop's
        answer carried them, and the metrics, unless they were large); what each task's
        offload runner did into ``offload`` (None: the job has no offload hosts)."""
        if not tasks:
            return
        make_private(self.local.local)
        on = {host: [t.file_name for t in tasks.values() if t.placement.host == host]
              for host in hosts_of(tasks) - lost_hosts}
        ended = self.inbox.ended
        self.fleet.fetch_logs({host: self.run_dir(host) for host in on}, on, self.local,
                              {host: end.logs for host, end in ended.items()})
        if offload is not None:
            self.offload_counts(tasks, on, offload)
        reporter = tasks.get(reporting_task(tasks))
        if reporter and reporter.placement.host in on:
            host = reporter.placement.host
            if host in ended:  # the stop's answer said (None: no metrics file)
                metrics = ended[host].metrics
                if metrics and metrics.strip():
                    Path(self.local.metrics).write_text(metrics)
                return
            self.fleet.fetch_metrics(host, self.run_dir(host), self.local)

    def offload_counts(self, tasks: Mapping[str, TaskState], on: Iterable[str],
                       into: dict[str, dict[str, Any]]) -> None:
        """What each task's offload runner did, from its node's end-of-run answer (a host
        that gave none, lost or not stopped, is left out of the counts)."""
        ended = self.inbox.ended
        for host in on:
            per_task = ended[host].offload if host in ended else {}
            into |= {t.name: per_task[t.file_name] for t in tasks.values()
                     if t.placement.host == host and t.file_name in per_task}

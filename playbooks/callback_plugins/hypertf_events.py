"""Ansible callback: one JSON line per playbook event, for ``invoke cluster.setup``.

hypertf.ops.provision runs ansible-playbook with this callback enabled and the path of a file in
``HYPERTF_PROVISION_EVENTS``; it follows that file to show progress per host and to name the
step at which a node failed. The normal Ansible output still goes to the run's log file.
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: hypertf_events
    type: aggregate
    short_description: JSON lines of task results per host, for HyperTF's provisioning
    description:
      - Writes one JSON object per line (play, task, per-host result, final stats) to the file
        named by the HYPERTF_PROVISION_EVENTS environment variable; does nothing without it.
    requirements:
      - enabled in callbacks_enabled (hypertf.ops.provision does this)
"""

MESSAGE_LIMIT = 2000


def _message(result: dict) -> str:
    """The most useful text of a failed or unreachable result, shortened."""
    parts = []
    if result.get("msg"):
        parts.append(str(result["msg"]))
    for key in ("stderr", "stdout", "module_stderr", "module_stdout"):
        text = str(result.get(key) or "").strip()
        if text:
            parts.append("\n".join(text.splitlines()[-8:]))
            break
    if len(parts) == 1 and result.get("cmd"):  # a command that did not even print
        command = result["cmd"] if isinstance(result["cmd"], str) else " ".join(result["cmd"])
        parts[0] += f" ({command}: exit {result.get('rc')})"
    if not parts and result.get("results"):  # a loop: the first failed item
        for item in result["results"]:
            if item.get("failed"):
                return _message(item)
    text = "\n".join(parts) or "failed (no message)"
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + " ..."


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "hypertf_events"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        path = os.environ.get("HYPERTF_PROVISION_EVENTS")
        self._out = open(path, "a", buffering=1, encoding="utf-8") if path else None  # noqa: SIM115
        self._started = time.monotonic()

    def _emit(self, event: str, **fields: object) -> None:
        if self._out is None:
            return
        fields.update(e=event, t=round(time.monotonic() - self._started, 3))
        self._out.write(json.dumps(fields, default=str) + "\n")

    @staticmethod
    def _task_fields(task) -> dict:
        role = task._role.get_name() if getattr(task, "_role", None) else ""
        name = task.get_name()
        prefix = f"{role} : "
        if role and name.startswith(prefix):
            name = name[len(prefix):]
        return {"role": role, "task": name}

    def v2_playbook_on_play_start(self, play) -> None:
        self._emit("play", name=play.get_name().strip(), check=bool(play.check_mode))

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self._emit("task", **self._task_fields(task))

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self._emit("task", handler=True, **self._task_fields(task))

    def _result(self, status: str, result, **extra: object) -> None:
        fields = self._task_fields(result._task)
        self._emit("result", host=result._host.get_name(), status=status, **fields, **extra)

    def v2_runner_on_ok(self, result) -> None:
        self._result("changed" if result._result.get("changed") else "ok", result)

    def v2_runner_on_failed(self, result, ignore_errors: bool = False) -> None:
        if ignore_errors:
            self._result("ignored", result)
        else:
            # A failed run_once task (on the control machine) stops every host of the play.
            self._result("failed", result, msg=_message(result._result),
                         run_once=bool(result._task.run_once))

    def v2_runner_on_skipped(self, result) -> None:
        self._result("skipped", result)

    def v2_runner_on_unreachable(self, result) -> None:
        self._result("unreachable", result, msg=_message(result._result))

    def v2_playbook_on_stats(self, stats) -> None:
        hosts = {}
        for host in sorted(stats.processed):
            summary = stats.summarize(host)
            hosts[host] = {key: summary.get(key, 0) for key in
                           ("ok", "changed", "failures", "unreachable", "skipped", "rescued",
                            "ignored")}
        self._emit("stats", hosts=hosts)
        if self._out is not None:
            self._out.close()
            self._out = None

"""``hypertf export``: one training request as Kubernetes, TFJob, Marathon or Docker files.

Pure functions from a TrainRequest to manifest dicts (no ZooKeeper, no SSH), plus writing.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hypertf.export.job import (
        ExportJob,
        ExportOptions,
        ExportTask,
        NodeSetup,
        plan,
    )
    from hypertf.export.names import TARGETS
    from hypertf.export.targets import (
        EXPORT_OPTIONS,
        command,
        export,
        export_options,
        job_for,
    )

# Imported when first used: every hypertf command builds its parser, whose help names the
# targets (hypertf.export.names), and must not pay for the renderers (~10 ms).
_HOMES = {"TARGETS": "names", "ExportJob": "job", "ExportOptions": "job", "ExportTask": "job",
          "NodeSetup": "job", "plan": "job", "EXPORT_OPTIONS": "targets", "command": "targets",
          "export": "targets", "export_options": "targets", "job_for": "targets"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


__all__ = ["EXPORT_OPTIONS", "TARGETS", "ExportJob", "ExportOptions", "ExportTask", "NodeSetup",
           "command", "export", "export_options", "job_for", "plan"]

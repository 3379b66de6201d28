"""``hypertf export``: one training request as Kubernetes, TFJob, Marathon or Docker files.

Pure functions from a TrainRequest to manifest dicts (no ZooKeeper, no SSH), plus writing.
"""

from hypertf.export.job import (
    TARGETS,
    ExportJob,
    ExportOptions,
    ExportTask,
    NodeSetup,
    plan,
)
from hypertf.export.targets import EXPORT_OPTIONS, command, export, export_options, job_for

__all__ = ["EXPORT_OPTIONS", "TARGETS", "ExportJob", "ExportOptions", "ExportTask", "NodeSetup",
           "command", "export", "export_options", "job_for", "plan"]

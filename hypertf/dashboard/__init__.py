"""``hypertf dashboard``: a read-only web page of the matrix, the queue, jobs and sweeps."""

from hypertf.dashboard.server import Dashboard, serve
from hypertf.dashboard.source import ClusterSource, DataSource, FixtureSource

__all__ = ["ClusterSource", "Dashboard", "DataSource", "FixtureSource", "serve"]

"""Reading one value off a running server's /metrics (shared by the service tests)."""

from loadtests.local_stack import metric_value

__all__ = ["metric_value"]

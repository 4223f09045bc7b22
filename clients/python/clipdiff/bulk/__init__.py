"""Scoring whole datasets through the service: ``clipdiff bulk ...`` and :func:`run`.

>>> from clipdiff.bulk import BulkOptions, run
>>> run("classify", "images/", "labels.parquet", options=BulkOptions(labels=("cat", "dog")))

Needs the ``bulk`` extra (``pip install "clipdiff-client[bulk]"``: pyarrow, numpy, rich).
"""

from clipdiff.bulk.datasets import FORMATS, open_dataset
from clipdiff.bulk.runner import BulkSummary, run, run_async, shard_bounds
from clipdiff.bulk.tasks import TASKS, BulkOptions

__all__ = ["FORMATS", "TASKS", "BulkOptions", "BulkSummary", "open_dataset", "run", "run_async", "shard_bounds"]

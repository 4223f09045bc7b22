"""The process's log output: formatted and written by a thread of its own, never by the event loop.

Every request logs one access line. Written where it is logged, formatting it (the time stamp) and
writing it to stderr under the handler's lock cost the event loop about a tenth of its time at
saturation on the tiny benchmark model (py-spy; docs/benchmarks.md, "Host path"). Here a logging
call only puts the record, its message already merged with its arguments, on a queue; a listener
thread formats and writes it. What is logged and how each line reads do not change. At exit
(``atexit``) the listener writes what is still queued before the process ends.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class _DeferredFormatting(logging.handlers.QueueHandler):
    """Queues the record with its message merged (its arguments may change after the call) and any
    traceback rendered to text (its frames must not be held), leaving the rest of formatting to
    the listener: the stock ``QueueHandler.prepare`` formats the whole line in the caller."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record.msg = record.getMessage()
        record.args = None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return record


def install_logging(level: str) -> logging.handlers.QueueListener:
    """Root logging at ``level`` through a queue to one stderr writer thread (started here, stopped
    and flushed at exit); returns the listener."""
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    writer = logging.StreamHandler()
    writer.setFormatter(logging.Formatter(FORMAT))
    listener = logging.handlers.QueueListener(records, writer)
    root = logging.getLogger()
    root.setLevel(level.upper())
    root.addHandler(_DeferredFormatting(records))
    listener.start()
    atexit.register(listener.stop)
    return listener

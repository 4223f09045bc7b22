"""Log lines are formatted and written by the listener thread, and read as before."""

from __future__ import annotations

import io
import logging
import logging.handlers
import queue
import re
import threading

from service.logs import FORMAT, _DeferredFormatting


def test_the_caller_queues_a_merged_record_and_the_listener_writes_the_usual_line() -> None:
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    out = io.StringIO()
    writer = logging.StreamHandler(out)
    writer.setFormatter(logging.Formatter(FORMAT))
    written_by: list[str] = []
    emit = writer.emit
    writer.emit = lambda record: (written_by.append(threading.current_thread().name), emit(record))  # type: ignore[method-assign]
    listener = logging.handlers.QueueListener(records, writer)
    log = logging.getLogger("test.logs")
    log.propagate = False
    log.setLevel(logging.INFO)
    handler = _DeferredFormatting(records)
    log.addHandler(handler)
    listener.start()
    try:
        args = {"n": 1}
        log.info("answer %s", args)
        args["n"] = 2  # changed after the call: the line shows the value at the call
        try:
            raise ValueError("broken")
        except ValueError:
            log.exception("failed %d", 7)
    finally:
        listener.stop()
        log.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO test\.logs answer \{'n': 1\}", lines[0])
    assert lines[1].endswith("ERROR test.logs failed 7")
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: broken"
    assert written_by and threading.main_thread().name not in written_by

"""Model logging from worker processes: ``pb_utils.Logger`` calls in a worker reach the
server's log, where the server's switches (``--log-info``, ``--log-verbose``, the logging
endpoint's settings at the time) and its format and file apply, as they do to a model in the
server's own process.

The worker forwards every record of the ``tritonfast.model`` logger over the instance's pipe as
``("log", fields)``; whoever reads the pipe in the server (the instance's batch, the event loop,
the decoupled models' relay, the start and the finalize) hands it to :func:`emit`. A record
logged between batches by a model's own thread is read with the next batch's answer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

MODEL_LOGGER = "tritonfast.model"
# What of a record travels: enough for the server's formatter (level, text, the model's file
# and line, when).
_FIELDS = (
    "levelno",
    "levelname",
    "pathname",
    "filename",
    "module",
    "lineno",
    "funcName",
    "created",
    "msecs",
    "relativeCreated",
    "process",
    "thread",
    "threadName",
)


class _Forward(logging.Handler):
    def __init__(self, send: Callable[[tuple[Any, ...]], None]) -> None:
        super().__init__(logging.DEBUG)
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        fields = {name: getattr(record, name) for name in _FIELDS}
        fields["msg"] = record.getMessage()
        with contextlib.suppress(OSError, ValueError):  # the server went away
            self._send(("log", fields))


def forward_model_logs(send: Callable[[tuple[Any, ...]], None]) -> None:
    """In a worker: every model log record goes to the server (which decides what to keep)."""
    logger = logging.getLogger(MODEL_LOGGER)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(_Forward(send))


def emit(message: tuple[Any, ...]) -> None:
    """In the server: log a record a worker forwarded, if the server's settings keep it."""
    fields = message[1]
    logger = logging.getLogger(MODEL_LOGGER)
    if logger.isEnabledFor(fields["levelno"]):
        record = logging.makeLogRecord(fields)
        record.name = MODEL_LOGGER
        logger.handle(record)

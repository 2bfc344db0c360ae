"""The root logger's level follows the enabled severities (``tritonfast.logsettings``).

Libraries log debug messages on hot paths (grpcio for every RPC); a record the level lets
through is built in full before the severity filter drops it, so the level must not be lower
than the lowest severity switched on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from tritonfast.logsettings import LogSettings, ServerLog


@pytest.fixture
def server_log() -> Iterator[ServerLog]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    log = ServerLog(LogSettings())
    try:
        yield log
    finally:
        log.close()
        root.setLevel(level)
        for handler in handlers:
            root.addHandler(handler)


def test_debug_records_are_not_built_unless_verbose(server_log: ServerLog) -> None:
    grpc_logger = logging.getLogger("grpc._cython.cygrpc")
    assert logging.getLogger().level == logging.INFO
    assert not grpc_logger.isEnabledFor(logging.DEBUG)
    server_log.update({"log_verbose_level": 1})
    assert grpc_logger.isEnabledFor(logging.DEBUG)
    server_log.update({"log_verbose_level": 0, "log_info": False})
    assert logging.getLogger().level == logging.WARNING
    assert not grpc_logger.isEnabledFor(logging.INFO)
    server_log.update({"log_warning": False})
    assert logging.getLogger().level == logging.ERROR
    server_log.update({"log_info": True, "log_warning": True})
    assert logging.getLogger().level == logging.INFO

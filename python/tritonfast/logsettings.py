"""The server's log: Triton's line format, its level switches, and the logging extension.

Lines look like Triton's (2.51)::

    I1122 02:09:33.854363 709 server.py:45] "successfully loaded 'add_sub' version(s) [1]"
    2026-11-22T02:10:12Z I 709 server.py:45] "..."          (--log-format=ISO8601)

The severity letter is I, W, E (and V for verbose messages, which Triton prints as I); the
message is quoted and escaped. Each severity is switched on or off on its own
(``--log-info``, ``--log-warning``, ``--log-error``); verbose messages need
``--log-verbose`` > 0. The same settings can be read and changed while serving through the
logging extension (``GET/POST /v2/logging``, gRPC ``LogSettings``), except the log file.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from tritonfast.errors import InvalidArgumentError, UnavailableError, UnsupportedError

FORMATS = ("default", "ISO8601")
_LETTERS = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E"}


@dataclass
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def as_dict(self) -> dict[str, Any]:
        """In the order Triton answers."""
        return asdict(self)


class TritonFormatter(logging.Formatter):
    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self._settings = settings
        self._pid = os.getpid()

    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTERS.get(record.levelno, "E" if record.levelno > logging.ERROR else "I")
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        where = f"{record.filename}:{record.lineno}"
        quoted = json.dumps(message, ensure_ascii=False)
        if self._settings.log_format == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            return f"{stamp} {letter} {self._pid} {where}] {quoted}"
        local = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        stamp = time.strftime("%m%d %H:%M:%S", local) + f".{micros:06d}"
        return f"{letter}{stamp} {self._pid} {where}] {quoted}"


class SeverityFilter(logging.Filter):
    """Lets through the severities that are switched on."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self._settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        settings = self._settings
        if record.levelno >= logging.ERROR:
            return settings.log_error
        if record.levelno >= logging.WARNING:
            return settings.log_warning
        if record.levelno >= logging.INFO:
            return settings.log_info
        return settings.log_verbose_level > 0


def _lowest_enabled(settings: LogSettings) -> int:
    if settings.log_verbose_level > 0:
        return logging.DEBUG
    if settings.log_info:
        return logging.INFO
    if settings.log_warning:
        return logging.WARNING
    return logging.ERROR


class ServerLog:
    """The process's log configuration: installed once by the server at start-up."""

    _installed: ServerLog | None = None

    def __init__(self, settings: LogSettings, *, install: bool = True) -> None:
        if settings.log_format not in FORMATS:
            raise InvalidArgumentError(
                f"invalid argument for --log-format, got: {settings.log_format}"
            )
        self.settings = settings
        self._lock = threading.Lock()
        self._handler: logging.Handler | None = None
        if install:
            self._install()

    @classmethod
    def current(cls) -> ServerLog:
        """The installed log, or default settings that configure nothing."""
        return cls._installed or cls(LogSettings(), install=False)

    def _install(self) -> None:
        stream: TextIO = sys.stderr
        if self.settings.log_file:
            stream = open(self.settings.log_file, "a", buffering=1)  # noqa: SIM115 - kept open
        handler = logging.StreamHandler(stream)
        handler.setFormatter(TritonFormatter(self.settings))
        handler.addFilter(SeverityFilter(self.settings))
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(handler)
        self._handler = handler
        self._apply_level()
        ServerLog._installed = self

    def close(self) -> None:
        if self._handler is None:
            return
        logging.getLogger().removeHandler(self._handler)
        if self.settings.log_file:
            self._handler.close()
        if ServerLog._installed is self:
            ServerLog._installed = None

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply the logging extension's changes (already typed); returns every setting.

        ``log_file`` cannot change over the network; ``None`` values are ignored.
        """
        if changes.get("log_file") is not None:
            raise UnsupportedError("log file location can not be updated through network protocol")
        log_format = changes.get("log_format")
        if log_format is not None and log_format not in FORMATS:
            raise UnavailableError(f"invalid argument for --log_format, got: {log_format}")
        with self._lock:
            for key in ("log_info", "log_warning", "log_error", "log_verbose_level", "log_format"):
                if changes.get(key) is not None:
                    setattr(self.settings, key, changes[key])
            if self._handler is not None:
                self._apply_level()
            return self.settings.as_dict()

    def _apply_level(self) -> None:
        """The root logger's level: the lowest severity switched on. The filter alone would do,
        but libraries log debug messages on hot paths (grpcio does for every RPC), and a record
        the level lets through costs microseconds to build before the filter drops it."""
        logging.getLogger().setLevel(_lowest_enabled(self.settings))

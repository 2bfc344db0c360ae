"""What can be checked of the command line before any model loads: the ports are free and the
TLS files readable. A mistake there then fails the start at once, naming its flag, instead of
after every model has loaded (which can take minutes)."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from tritonfast.cli import ServeOptions
from tritonfast.errors import InvalidArgumentError


def check(options: ServeOptions) -> None:
    """InvalidArgumentError naming the flag of the first problem found."""
    _check_tls(options)
    _check_ports(options)


def _check_ports(options: ServeOptions) -> None:
    taken: dict[int, str] = {}
    for e in options.endpoints():
        if e.port in taken and e.port != 0:
            raise InvalidArgumentError(
                f"the {e.service} endpoint cannot listen on port {e.port} ({e.flag}): the"
                f" {taken[e.port]} endpoint is given it too"
            )
        taken[e.port] = e.service
        problem = _cannot_listen(e.address, e.port)
        if problem is not None:
            raise InvalidArgumentError(
                f"the {e.service} endpoint cannot listen on {e.address}:{e.port} ({e.flag}):"
                f" {problem}"
            )


def _cannot_listen(address: str, port: int) -> str | None:
    """Why a server could not listen on ``address:port`` now (None: it could), found by
    binding a socket there as the servers do (SO_REUSEADDR) and letting it go."""
    host = address.strip("[]") or None
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        return f"unknown address ({error.strerror})"
    family, kind, protocol, _, place = found[0]
    with socket.socket(family, kind, protocol) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(place)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return "address already in use (another server on that port?)"
            return os.strerror(error.errno) if error.errno else str(error)
    return None


def _check_tls(options: ServeOptions) -> None:
    if options.grpc_use_ssl or options.grpc_use_ssl_mutual:
        using = "--grpc-use-ssl-mutual" if options.grpc_use_ssl_mutual else "--grpc-use-ssl"
        if not (options.grpc_server_cert and options.grpc_server_key):
            raise InvalidArgumentError(
                f"{using} needs --grpc-server-cert and --grpc-server-key (PEM files)"
            )
        if options.grpc_use_ssl_mutual and not options.grpc_root_cert:
            raise InvalidArgumentError("--grpc-use-ssl-mutual needs --grpc-root-cert")
        for flag, path in (
            ("--grpc-server-cert", options.grpc_server_cert),
            ("--grpc-server-key", options.grpc_server_key),
            ("--grpc-root-cert", options.grpc_root_cert),
        ):
            _readable(flag, path)
    if options.http_tls_key and not options.http_tls_cert:
        raise InvalidArgumentError("--http-tls-key needs --http-tls-cert")
    for flag, path in (
        ("--http-tls-cert", options.http_tls_cert),
        ("--http-tls-key", options.http_tls_key),
    ):
        _readable(flag, path)


def _readable(flag: str, path: str) -> None:
    if not path:
        return
    try:
        with Path(path).open("rb"):
            pass
    except OSError as error:
        raise InvalidArgumentError(
            f"cannot read {flag} '{path}': {error.strerror or error}"
        ) from None

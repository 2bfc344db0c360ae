"""Restricted APIs (Triton's ``--http-restricted-api`` and ``--grpc-restricted-protocol``):
groups of endpoints that answer only requests carrying a given header with a given value.

A flag reads ``<api>[,<api>...]:<key>=<value>``; the groups are Triton's: health, metadata,
inference, shared-memory, model-config, model-repository, statistics, trace, logging. Over
HTTP the header is ``<key>``; over gRPC the metadata key is ``triton-grpc-protocol-<key>``, as
Triton names it. A request without it is refused as Triton refuses it (HTTP 403, gRPC
UNAVAILABLE; texts in :func:`http_refusal` / :func:`grpc_refusal`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tritonfast.errors import InvalidArgumentError

API_GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

# gRPC method name -> API group.
GRPC_GROUPS = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "Check": "health",  # grpc.health.v1
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


@dataclass(frozen=True)
class Restriction:
    key: str
    value: str


def parse(flags: Iterable[str], option: str) -> dict[str, Restriction]:
    """API group -> the header it needs, from the flags' values."""
    restrictions: dict[str, Restriction] = {}
    kind = "protocol" if option.endswith("protocol") else "api"  # as Triton names them
    for flag in flags:
        apis, colon, header = flag.partition(":")
        key, equals, value = header.partition("=")
        if not colon or not equals or not key or not apis:
            raise InvalidArgumentError(
                f"{option} option format is '<API_1>,<API_2>:<restricted-key>=<restricted-value>'."
                f" Got {flag}"
            )
        for api in (a.strip() for a in apis.split(",")):
            if api not in API_GROUPS:
                raise InvalidArgumentError(
                    f"unknown restricted {kind} '{api}' in {option}; the groups are"
                    f" {', '.join(API_GROUPS)}"
                )
            if api in restrictions:
                raise InvalidArgumentError(
                    f"restricted {kind} '{api}' can not be specified in multiple config groups"
                )
            restrictions[api] = Restriction(key.strip(), value)
    return restrictions


def http_refusal(restriction: Restriction) -> str:
    return f"This API is restricted, expecting header '{restriction.key}'"


def grpc_refusal(restriction: Restriction) -> str:
    return f"This protocol is restricted, expecting header '{GRPC_HEADER_PREFIX}{restriction.key}'"

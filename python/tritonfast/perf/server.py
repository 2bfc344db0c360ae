"""What the load generator asks the server besides inference: the model's metadata and
configuration (to build its inputs, as perf_analyzer does) and its statistics (the server's
side of the report), over the protocol under test."""

from __future__ import annotations

import base64
import http.client
import json
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import quote

import grpc

from tritonfast._proto import grpc_service_pb2 as pb
from tritonfast._proto import grpc_service_pb2_grpc as pb_grpc

# The duration statistics of the statistics extension, each a count and nanoseconds.
DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


class ServerError(RuntimeError):
    """The server refused a control request; the text is its own."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True)
class ModelInfo:
    name: str
    version: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: int
    decoupled: bool
    sequence: bool


@dataclass(frozen=True)
class ServerStats:
    """One model's cumulative statistics; subtract two to get a window's."""

    inference_count: int = 0
    execution_count: int = 0
    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    compute_input_count: int = 0
    compute_input_ns: int = 0
    compute_infer_count: int = 0
    compute_infer_ns: int = 0
    compute_output_count: int = 0
    compute_output_ns: int = 0
    cache_hit_count: int = 0
    cache_hit_ns: int = 0
    cache_miss_count: int = 0
    cache_miss_ns: int = 0

    def __add__(self, other: ServerStats) -> ServerStats:
        return ServerStats(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def __sub__(self, other: ServerStats) -> ServerStats:
        return ServerStats(
            **{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        )

    def average_us(self, duration: str) -> int:
        count = getattr(self, f"{duration}_count")
        return getattr(self, f"{duration}_ns") // count // 1000 if count else 0


def _stats_of(model_stats: dict[str, Any]) -> ServerStats:
    values = {
        "inference_count": int(model_stats.get("inference_count", 0)),
        "execution_count": int(model_stats.get("execution_count", 0)),
    }
    durations = model_stats.get("inference_stats", {})
    for name in DURATIONS:
        entry = durations.get(name, {})
        values[f"{name}_count"] = int(entry.get("count", 0))
        values[f"{name}_ns"] = int(entry.get("ns", 0))
    return ServerStats(**values)


def _stats_of_all(entries: list[dict[str, Any]]) -> ServerStats:
    """The statistics of every version asked for, summed (no version named: all of them)."""
    return sum((_stats_of(entry) for entry in entries), ServerStats())


class HttpControl:
    """Metadata, configuration and statistics over the HTTP/REST protocol."""

    def __init__(self, address: str) -> None:
        self.address = address

    def _request(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """GET ``path``, or POST ``body`` to it; the answer's JSON."""
        host, _, port = self.address.rpartition(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            if body is None:
                connection.request("GET", path)
            else:
                connection.request("POST", path, body=json.dumps(body))
            answer = connection.getresponse()
            text = answer.read()
        except OSError as e:
            raise ServerError(f"cannot reach {self.address}: {e}") from None
        finally:
            connection.close()
        try:
            parsed = json.loads(text) if text else {}
        except ValueError:
            parsed = {"error": text.decode(errors="replace")}
        if answer.status != 200:
            raise ServerError(parsed.get("error", f"HTTP {answer.status}"))
        return parsed

    def _model_path(self, model: str, version: str) -> str:
        path = f"/v2/models/{quote(model, safe='')}"
        return f"{path}/versions/{quote(version, safe='')}" if version else path

    def model_info(self, model: str, version: str) -> ModelInfo:
        path = self._model_path(model, version)
        metadata = self._request(path)
        config = self._request(f"{path}/config")
        return _model_info(metadata, config, version)

    def statistics(self, model: str, version: str) -> ServerStats:
        answer = self._request(f"{self._model_path(model, version)}/stats")
        return _stats_of_all(answer.get("model_stats", []))

    def register_system(self, name: str, key: str, byte_size: int) -> None:
        body = {"key": key, "offset": 0, "byte_size": byte_size}
        self._request(f"/v2/systemsharedmemory/region/{quote(name, safe='')}/register", body)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        handle = {"b64": base64.b64encode(raw_handle).decode()}
        body = {"raw_handle": handle, "device_id": device_id, "byte_size": byte_size}
        self._request(f"/v2/cudasharedmemory/region/{quote(name, safe='')}/register", body)

    def unregister(self, kind: str, name: str) -> None:
        self._request(f"/v2/{kind}sharedmemory/region/{quote(name, safe='')}/unregister", {})

    def close(self) -> None:
        pass


class GrpcControl:
    """Metadata, configuration and statistics over gRPC."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self.stub, method)(request, timeout=30)
        except grpc.RpcError as e:
            raise ServerError(e.details() or f"cannot reach {self.address}") from None

    def model_info(self, model: str, version: str) -> ModelInfo:
        from google.protobuf import json_format

        metadata = self._call("ModelMetadata", pb.ModelMetadataRequest(name=model, version=version))
        config = self._call("ModelConfig", pb.ModelConfigRequest(name=model, version=version))
        as_dict = {"preserving_proto_field_name": True}
        return _model_info(
            json_format.MessageToDict(metadata, **as_dict),
            json_format.MessageToDict(config.config, **as_dict),
            version,
        )

    def register_system(self, name: str, key: str, byte_size: int) -> None:
        request = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, byte_size=byte_size)
        self._call("SystemSharedMemoryRegister", request)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        request = pb.CudaSharedMemoryRegisterRequest(
            name=name, raw_handle=raw_handle, device_id=device_id, byte_size=byte_size
        )
        self._call("CudaSharedMemoryRegister", request)

    def unregister(self, kind: str, name: str) -> None:
        if kind == "cuda":
            self._call(
                "CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest(name=name)
            )
        else:
            request = pb.SystemSharedMemoryUnregisterRequest(name=name)
            self._call("SystemSharedMemoryUnregister", request)

    def statistics(self, model: str, version: str) -> ServerStats:
        from google.protobuf import json_format

        answer = self._call(
            "ModelStatistics", pb.ModelStatisticsRequest(name=model, version=version)
        )
        as_dict = json_format.MessageToDict(answer, preserving_proto_field_name=True)
        return _stats_of_all(as_dict.get("model_stats", []))

    def close(self) -> None:
        self.channel.close()


def _model_info(metadata: dict[str, Any], config: dict[str, Any], version: str) -> ModelInfo:
    def specs(entries: list[dict[str, Any]]) -> list[TensorSpec]:
        return [
            TensorSpec(e["name"], e["datatype"], [int(d) for d in e.get("shape", [])])
            for e in entries
        ]

    versions = metadata.get("versions") or [""]
    return ModelInfo(
        name=metadata.get("name", ""),
        version=version or str(versions[-1]),
        inputs=specs(metadata.get("inputs", [])),
        outputs=specs(metadata.get("outputs", [])),
        max_batch_size=int(config.get("max_batch_size", 0)),
        decoupled=bool(config.get("model_transaction_policy", {}).get("decoupled", False)),
        sequence="sequence_batching" in config,
    )


def control_for(protocol: str, address: str) -> HttpControl | GrpcControl:
    return GrpcControl(address) if protocol == "grpc" else HttpControl(address)

"""Exporting request traces to OpenTelemetry (``--trace-config mode=opentelemetry``).

Needs the ``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-http`` packages
(the ``opentelemetry`` extra: ``pip install '.[opentelemetry]'`` from a checkout). Each
traced request becomes one span named ``InferRequest`` from its first to its last timestamp,
with the model's name and version and the request id as attributes and every timestamp
(``REQUEST_START``, ``QUEUE_START``,
``COMPUTE_START``…) as a span event; spans go in batches, over OTLP/HTTP, to ``url``
(``--trace-config opentelemetry,url=…``, default ``http://localhost:4318/v1/traces``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tritonfast.errors import InvalidArgumentError

if TYPE_CHECKING:
    from tritonfast.tracing import RequestTrace

DEFAULT_URL = "http://localhost:4318/v1/traces"
SERVICE_NAME = "triton-inference-server"


class OpenTelemetryExporter:
    def __init__(self, url: str = DEFAULT_URL, resource: dict[str, str] | None = None) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise InvalidArgumentError(
                "--trace-config mode=opentelemetry needs the opentelemetry-sdk and"
                " opentelemetry-exporter-otlp-proto-http packages"
            ) from None
        attributes = {"service.name": SERVICE_NAME, **(resource or {})}
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        self._tracer: Any = self._provider.get_tracer("tritonfast")
        # Trace stamps are monotonic; spans want the epoch.
        self._epoch_offset = time.time_ns() - time.perf_counter_ns()

    def export(self, trace: RequestTrace) -> None:
        stamps = sorted(trace.timestamps, key=lambda stamp: stamp[1])
        if not stamps:
            return
        offset = self._epoch_offset
        attributes: dict[str, Any] = {
            "triton.model_name": trace.model_name,
            "triton.model_version": trace.model_version,
            "triton.trace_id": trace.id,
        }
        if trace.request_id:
            attributes["triton.request_id"] = trace.request_id
        span = self._tracer.start_span(
            "InferRequest", start_time=stamps[0][1] + offset, attributes=attributes
        )
        for name, ns in stamps:
            span.add_event(name, timestamp=ns + offset)
        span.end(end_time=stamps[-1][1] + offset)

    def shutdown(self) -> None:
        """Send what is still batched, then stop."""
        self._provider.shutdown()

"""PyTriton's request type (``pytriton.proxy.types``)."""

from tritonfast.callables.request import Request

Requests = list[Request]

__all__ = ["Request", "Requests"]

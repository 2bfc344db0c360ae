"""PyTriton's clients (``pytriton.client``)."""

from tritonfast.pytriton.client.client import (
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)

__all__ = ["AsyncioModelClient", "DecoupledModelClient", "FuturesModelClient", "ModelClient"]

"""What every backend implements: one object per model instance."""

from __future__ import annotations

import abc

from tritonfast.errors import TritonError
from tritonfast.runtime.types import InferRequest, InferResponse

# One result per request, in request order: a response, or the error for that request.
Result = InferResponse | TritonError


class Backend(abc.ABC):
    """A model instance. ``execute`` runs on the instance's own thread, never on the loop."""

    @abc.abstractmethod
    def execute(self, requests: list[InferRequest]) -> list[Result]:
        """Run one batch of requests; return exactly one result per request."""

    def finalize(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release the instance's resources (called once, after its last execute)."""

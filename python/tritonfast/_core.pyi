"""Type stubs for ``tritonfast._core``, the Rust core (built from ``rust/src/py``)."""

from typing import Any, final

__version__: str

@final
class RequestQueue:
    """A per-model request queue with dynamic batching.

    With ``max_batch_size == 0`` batching is off and every batch is one item. Otherwise a batch
    takes items in FIFO order, never splitting one, while the sum of their batch sizes stays
    within ``max_batch_size``; it leaves when full, when a prefix reaches a preferred batch size,
    or ``max_queue_delay_us`` after its oldest item was enqueued. Several threads may call
    :meth:`pop_batch` at once; each item goes to exactly one of them.

    Errors are raised as :mod:`tritonfast.errors` exceptions (``InvalidArgumentError`` for a bad
    batch size or policy, ``UnavailableError`` for a push after :meth:`close`).
    """

    def __init__(
        self,
        max_batch_size: int = 0,
        max_queue_delay_us: int = 0,
        preferred_batch_sizes: list[int] = ...,
    ) -> None: ...
    def push(self, item: object, batch_size: int = 1) -> None:
        """Enqueue ``item`` (never blocks)."""

    def pop_batch(self, timeout_us: int) -> list[Any] | None:
        """Wait up to ``timeout_us`` microseconds, with the GIL released, for a batch.

        Returns the batch, ``[]`` on timeout, or ``None`` once the queue is closed and drained.
        ``timeout_us=0`` polls: it returns a batch only if one may leave right now. Once this
        call holds an item, the batch leaves by the batching rules (at the latest
        ``max_queue_delay_us`` after its oldest item was enqueued), even past ``timeout_us``.
        """

    def close(self) -> None:
        """Reject further pushes and wake every waiter; queued items are still handed out."""

    @property
    def closed(self) -> bool: ...
    def __len__(self) -> int: ...

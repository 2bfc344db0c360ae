"""Heavy work on request bodies runs on threads the scheduler ranks below the event loop."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from tritonfast.api import bulkwork


def _own_priority() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="needs getpriority")
def test_bulk_work_runs_at_a_lower_priority_than_its_caller() -> None:
    caller = _own_priority()
    if caller >= bulkwork.NICE:
        pytest.skip(f"this process already runs at nice {caller}")

    work = bulkwork.BulkWork()

    async def main() -> tuple[int, str]:
        return await work.run(lambda: (_own_priority(), threading.current_thread().name))

    priority, thread = asyncio.run(main())
    work.close()
    assert priority == bulkwork.NICE
    assert thread.startswith("tritonfast-bulk")
    assert _own_priority() == caller  # the caller's own thread is left as it was

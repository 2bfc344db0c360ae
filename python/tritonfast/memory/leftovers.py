"""What a server that did not stop cleanly (SIGKILL, a crash, the machine's OOM killer) leaves
behind, and the sweep that removes it when the next server starts.

Every file a server creates outside its model repositories names the process that made it:
shared-memory segments in ``/dev/shm`` (``tritonfast-<kind>-...-<pid>-<n>``, see
:mod:`.shmsegment`, and request bodies' ``tritonfast-body-<pid>-<n>``, see :mod:`.bufferpool`)
and temporary directories (``tritonfast-model-<pid>-...`` for uploaded
models, ``tritonfast-bound-<pid>-...`` for bound callables). A clean shutdown removes its own;
the sweep removes those whose process is gone. A process that still runs (or a new process
that got the same pid) keeps its files: the sweep never takes what may be in use.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from tritonfast.memory.shmsegment import SHM_DIR

log = logging.getLogger(__name__)

# Segments: the creator's pid is the next to last field (Segment.create).
_SEGMENT = re.compile(r"tritonfast-(?:(?:in|out|cancel)-.*|body)-(\d+)-\d+")
# Temporary directories: the creator's pid comes right after the prefix.
_DIRECTORY = re.compile(r"tritonfast-(?:model|bound)-(\d+)-.*")
DIRECTORY_PREFIXES = ("model", "bound")


def temp_dir_prefix(kind: str) -> str:
    """The ``tempfile.mkdtemp`` prefix for a temporary directory of ``kind`` (one of
    :data:`DIRECTORY_PREFIXES`) made by this process."""
    assert kind in DIRECTORY_PREFIXES
    return f"tritonfast-{kind}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def sweep(shm_dir: Path = SHM_DIR, temp_dir: Path | None = None) -> int:
    """Remove the segments and temporary directories of processes that are gone; returns how
    many were removed."""
    removed = 0
    candidates: list[tuple[Path, re.Pattern[str]]] = []
    if shm_dir.is_dir():
        candidates += [(path, _SEGMENT) for path in shm_dir.glob("tritonfast-*")]
    temp = Path(temp_dir or tempfile.gettempdir())
    candidates += [(path, _DIRECTORY) for path in temp.glob("tritonfast-*")]
    for path, pattern in candidates:
        match = pattern.fullmatch(path.name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:  # another sweep got there first, or not ours to remove
            continue
        removed += 1
    if removed:
        log.info("removed %d file(s) left by server processes that are gone", removed)
    return removed

"""Python-backend models that the end-to-end tests write into a temporary repository, and the
files where such models mark their runs (one line each)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def write_model(repository: Path, name: str, config: str, model: str) -> None:
    """Writes model ``name`` into ``repository``: ``config`` as its config.pbtxt and ``model``
    as version 1's model.py."""
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config)
    (repository / name / "1" / "model.py").write_text(model)


@dataclass
class Marks:
    """A file where a model appends a line each time it runs."""

    path: Path

    def count(self) -> int:
        """The runs marked so far."""
        return len(self.path.read_text().splitlines()) if self.path.exists() else 0

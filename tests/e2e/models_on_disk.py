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


def bls_caller(target: str) -> str:
    """A model.py that answers each request with what model ``target`` answers its input X
    (output Y) through a BLS call, or with that call's error."""
    return _BLS_CALLER.replace("TARGET", target)


_BLS_CALLER = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="TARGET",
                requested_output_names=["Y"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "X")],
            )
            answer = call.exec()
            if answer.has_error():
                error = pb_utils.TritonError(answer.error().message())
                answers.append(pb_utils.InferenceResponse(error=error))
            else:
                answers.append(
                    pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "Y")])
                )
        return answers
"""


@dataclass
class Marks:
    """A file where a model appends a line each time it runs."""

    path: Path

    def count(self) -> int:
        """The runs marked so far."""
        return len(self.path.read_text().splitlines()) if self.path.exists() else 0

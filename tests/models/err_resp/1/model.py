"""Answers every request with an error response (not an exception)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(error=pb_utils.TritonError("custom error from model"))
            for _ in requests
        ]

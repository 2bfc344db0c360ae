"""Sleeps 0.5 s per execution; SEEN_PARALLEL is always 1 (one instance)."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.5)
        out = np.ones((1, 1), dtype=np.int32)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("SEEN_PARALLEL", out)]) for _ in requests
        ]

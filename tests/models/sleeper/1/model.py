"""Sleeps 0.5 s per execution and reports the peak number of overlapping executions."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

_lock = threading.Lock()
_active = 0
_peak = 0


class TritonPythonModel:
    def execute(self, requests):
        global _active, _peak
        with _lock:
            _active += 1
            _peak = max(_peak, _active)
        time.sleep(0.5)  # releases the GIL, as real model work in C would
        with _lock:
            peak = _peak
            _active -= 1
        out = pb_utils.Tensor("SEEN_PARALLEL", np.array([peak], dtype=np.int32))
        return [pb_utils.InferenceResponse([out]) for _ in requests]

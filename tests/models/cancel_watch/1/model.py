"""Observes request.is_cancelled() on a running request (see config.pbtxt)."""

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

_seen = 0
_lock = threading.Lock()


class TritonPythonModel:
    def initialize(self, args):
        marks = json.loads(args["model_config"]).get("parameters", {}).get("MARKS")
        self.marks = marks["string_value"] if marks else None

    def execute(self, requests):
        global _seen
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 0:
                if self.marks:
                    with open(self.marks, "a") as marks:
                        marks.write("running\n")
                stop = threading.Event()
                for _ in range(1000):  # up to 10 s
                    if request.is_cancelled():
                        with _lock:
                            _seen += 1
                        break
                    stop.wait(0.01)
            with _lock:
                seen = np.array([_seen], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", seen)]))
        return responses

"""Echoes its inputs and reports the process that ran it; "crash" in STR ends the worker with
os._exit(3), "segv" crashes it in native code, "abort" calls abort(), "raise" raises, "sleep"
sleeps 0.2 s, "silent" asks whether it was cancelled and returns no responses at all. SPAN is
when execute ran (time.time() at its start and end).
"""

import ctypes
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        started = time.time()
        responses = []
        for request in requests:
            f32 = pb_utils.get_input_tensor_by_name(request, "F32").as_numpy()
            text = pb_utils.get_input_tensor_by_name(request, "STR")
            words = text.as_numpy() if text is not None else np.array([[b""]], dtype=object)
            first = words.reshape(-1)[0] if words.size else b""
            if first == b"crash":
                os._exit(3)
            if first == b"segv":
                ctypes.string_at(0)  # reads address 0: SIGSEGV
            if first == b"abort":
                os.abort()
            if first == b"silent":
                request.is_cancelled()
                return None
            if first == b"raise":
                raise ValueError("asked to raise")
            if first == b"sleep":
                time.sleep(0.2)
            pid = np.full((f32.shape[0], 1), os.getpid(), dtype=np.int64)
            responses.append(
                [
                    pb_utils.Tensor("F32_OUT", f32 * 2),
                    pb_utils.Tensor("STR_OUT", words),
                    pb_utils.Tensor("PID", pid),
                ]
            )
        span = np.array([[started, time.time()]])
        return [
            pb_utils.InferenceResponse(
                [*tensors, pb_utils.Tensor("SPAN", np.repeat(span, len(tensors[2].as_numpy()), 0))]
            )
            for tensors in responses
        ]

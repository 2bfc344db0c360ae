"""Waits for its input to change in place (see config.pbtxt)."""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            wait_ms = int(pb_utils.get_input_tensor_by_name(request, "WAIT_MS").as_numpy()[0])
            first = data[0]
            deadline = time.monotonic() + wait_ms / 1000
            while data[0] == first and time.monotonic() < deadline:
                time.sleep(0.005)
            out = pb_utils.Tensor("OUTPUT0", data.copy())
            responses.append(pb_utils.InferenceResponse([out]))
        return responses

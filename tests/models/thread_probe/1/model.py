"""Reports, per request, whether its batch ran on the server's main thread (the event loop)."""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        on_loop = int(threading.current_thread() is threading.main_thread())
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().shape[0]
            answer = np.full((rows, 1), on_loop, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("ON_LOOP", answer)]))
        return responses

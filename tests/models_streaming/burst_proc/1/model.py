import time

import numpy as np
import triton_python_backend_utils as pb_utils


def scalar(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


def response(index):
    return pb_utils.InferenceResponse([pb_utils.Tensor("IDX", np.array([index], dtype=np.int32))])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count, pause_ms = scalar(request, "COUNT"), scalar(request, "PAUSE_MS")
            sender = request.get_response_sender()
            for index in range(count):
                sender.send(response(index))
            time.sleep(pause_ms / 1000)
            sender.send(response(count), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

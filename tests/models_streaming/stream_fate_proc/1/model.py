import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def response(index):
    return pb_utils.InferenceResponse([pb_utils.Tensor("IDX", np.array([index], dtype=np.int32))])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 1:
                sender.send(response(0))
                sender.send(response(1))
                time.sleep(0.2)  # both on their way before the worker goes
                os._exit(3)
            index = 0
            while not sender.is_cancelled() and index < 3000:
                sender.send(response(index))
                index += 1
                time.sleep(0.01)
            pb_utils.Logger.log_info(f"stream {request.request_id()} saw its cancellation")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

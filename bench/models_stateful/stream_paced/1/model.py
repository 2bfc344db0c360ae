# stream_repeat's responses, paced: each one waits until PACE_S after the previous one was
# due, so that a stream's responses come at a steady rate whatever the server's speed.
import time

import numpy as np
import triton_python_backend_utils as pb_utils

PACE_S = 0.0005


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            sender = request.get_response_sender()
            due = time.monotonic()
            for index in range(count):
                out = pb_utils.Tensor("OUT", np.array([index], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
                due += PACE_S
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

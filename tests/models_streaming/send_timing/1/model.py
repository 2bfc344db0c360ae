import time

import numpy as np
import triton_python_backend_utils as pb_utils


def one(name, value):
    return pb_utils.Tensor(name, np.array([value], dtype=np.int32))


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            started = time.monotonic()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            size = int(pb_utils.get_input_tensor_by_name(request, "PAD_BYTES").as_numpy()[0])
            pad = pb_utils.Tensor("PAD", np.zeros(size, dtype=np.uint8))
            sender = request.get_response_sender()
            for index in range(count):
                sender.send(pb_utils.InferenceResponse([one("IDX", index), pad]))
            sent_ms = int((time.monotonic() - started) * 1000)
            sender.send(
                pb_utils.InferenceResponse([one("SENT_MS", sent_ms)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None

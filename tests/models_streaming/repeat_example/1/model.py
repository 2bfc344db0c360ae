import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def tensor(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        self.senders = []

    def execute(self, requests):
        for request in requests:
            values, delays = tensor(request, "IN").copy(), tensor(request, "DELAY").copy()
            if values.shape != delays.shape:
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("IN and DELAY must have the same shape")
                    ),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            sender = request.get_response_sender()
            thread = threading.Thread(target=self.send, args=(sender, values, delays))
            thread.start()
            self.senders.append(thread)
        time.sleep(float(tensor(requests[0], "WAIT")[0]) / 1000)
        return None

    def send(self, sender, values, delays):
        for index, (value, delay) in enumerate(zip(values.tolist(), delays.tolist(), strict=True)):
            time.sleep(delay / 1000)
            sender.send(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                        pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
                    ]
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.senders:
            thread.join()

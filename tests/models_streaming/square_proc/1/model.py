import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if count < 0:
                raise pb_utils.TritonModelException("IN must be non-negative")
            sender = request.get_response_sender()
            thread = threading.Thread(target=self.send, args=(sender, count))
            thread.start()
            self.threads.append(thread)
        return None

    def send(self, sender, count):
        for _ in range(count):
            out = pb_utils.Tensor("OUT", np.array([count], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()

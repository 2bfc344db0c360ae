"""Holds its instance HOLD seconds, then answers OUT = HOLD and the final flag."""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            hold = pb_utils.get_input_tensor_by_name(request, "HOLD").as_numpy()
            time.sleep(float(hold.reshape(-1)[0]))
            sender = request.get_response_sender()
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", hold)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None

"""Decoupled: one response per element of IN, sent from a thread after execute returns, then
the final flag alone (as python_backend's ``repeat`` example does); a stream whose client went
away first is logged."""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            args = (sender, values.copy(), request.request_id())
            threading.Thread(target=self._send, args=args, daemon=True).start()
        return None

    def _send(self, sender, values, request_id):
        for index, value in enumerate(values.tolist()):
            if sender.is_cancelled():
                pb_utils.Logger.log_info(f"repeat {request_id} saw its cancellation")
                break
            sender.send(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                        pb_utils.Tensor("IDX", np.array([index], dtype=np.int32)),
                    ]
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

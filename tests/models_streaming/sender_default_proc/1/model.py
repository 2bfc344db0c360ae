"""A default (not decoupled) model that answers through its response sender from a thread,
after execute returned None. Before answering it tries to send the final flag alone, which
Triton refuses for such a model; the refusal's message comes back in the output REFUSAL."""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            threading.Thread(target=self._answer, args=(sender, values), daemon=True).start()
        return None

    def _answer(self, sender, values):
        try:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            refusal = "accepted"
        except pb_utils.TritonModelException as error:
            refusal = str(error)
        response = pb_utils.InferenceResponse(
            [
                pb_utils.Tensor("OUT", values + 1),
                pb_utils.Tensor("REFUSAL", np.array([refusal.encode()], dtype=np.object_)),
            ]
        )
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

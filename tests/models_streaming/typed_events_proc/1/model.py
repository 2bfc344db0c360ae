import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().reshape(-1)
            asked = json.dumps(json.loads(request.parameters()), sort_keys=True)
            sender = request.get_response_sender()
            for k in range(1, len(x) + 1):
                head = x[:k]
                words = np.array([f'{v!r}"é\n'.encode() for v in head.tolist()], dtype=object)
                outputs = [
                    pb_utils.Tensor("F", head),
                    pb_utils.Tensor("S", words),
                    pb_utils.Tensor("B", head > 0),
                ]
                parameters = {
                    "count": k,
                    "mean": float(head.mean()),
                    "sign": 'é"+' if head[-1] >= 0 else "-",
                    "negative": bool(head[-1] < 0),
                    "F": "overridden",
                    "asked": asked,
                }
                sender.send(pb_utils.InferenceResponse(outputs, parameters=parameters))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

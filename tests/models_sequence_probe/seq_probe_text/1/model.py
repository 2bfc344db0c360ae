import json

import numpy as np
import triton_python_backend_utils as pb_utils


def tensor(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    """Echoes what the server handed it (see config.pbtxt)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            controls = [
                repr(tensor(request, name).reshape(-1)[0]).encode()
                for name in ("START", "END", "READY", "CORRID")
            ]
            seen = json.dumps(
                {
                    "corrid": request.correlation_id(),
                    "parameters": json.loads(request.parameters()),
                    "requests": len(requests),
                    "dtypes": [
                        tensor(request, n).dtype.str for n in ("START", "END", "READY", "CORRID")
                    ],
                    "shape": list(tensor(request, "START").shape),
                },
                sort_keys=True,
            )
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("CONTROLS", np.array(controls, dtype=object)),
                        pb_utils.Tensor("ECHO", tensor(request, "IN")),
                        pb_utils.Tensor("SEEN", np.array([seen.encode()], dtype=object)),
                    ]
                )
            )
        return responses

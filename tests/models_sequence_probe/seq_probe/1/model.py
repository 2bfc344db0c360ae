import json

import numpy as np
import triton_python_backend_utils as pb_utils

FLAGS = ("START", "END", "READY", "CORRID")


def value(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    """Echoes what the server handed it (see config.pbtxt)."""

    def execute(self, requests):
        nulls = [r for r in requests if int(value(r, "READY").reshape(-1)[0]) == 0]
        # A null request's inputs: zeros shaped like the batch's first request's.
        null_elements = sum(int(value(r, "IN").size) for r in nulls)
        null_sum = sum(
            int(value(r, "IN").sum()) + sum(int(value(r, f).reshape(-1)[0]) for f in FLAGS)
            for r in nulls
        )
        batch = np.array([[len(requests), len(nulls), null_elements + 1000 * null_sum]])
        responses = []
        for request in requests:
            controls = np.array(
                [[int(value(request, f).reshape(-1)[0]) for f in FLAGS]], dtype=np.int64
            )
            text = value(request, "TEXT")
            seen = json.dumps(
                {
                    "corrid": request.correlation_id(),
                    "parameters": json.loads(request.parameters()),
                    "id": request.request_id(),
                    "shapes": {t.name(): list(t.shape()) for t in request.inputs()},
                    "text": None if text is None else [bytes(b).decode() for b in text.reshape(-1)],
                },
                sort_keys=True,
            )
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("CONTROLS", controls),
                        pb_utils.Tensor("BATCH", batch.astype(np.int64)),
                        pb_utils.Tensor("ECHO", value(request, "IN")),
                        pb_utils.Tensor("SEEN", np.array([[seen.encode()]], dtype=object)),
                    ]
                )
            )
        return responses

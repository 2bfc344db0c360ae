import json

import numpy as np
import triton_python_backend_utils as pb_utils


def value(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    """Echoes the states the server handed it and returns the next ones (see config.pbtxt)."""

    def execute(self, requests):
        nulls = [r for r in requests if int(value(r, "READY").reshape(-1)[0]) == 0]
        # A null request's states are the initial ones: HISTORY [[0]], LAST [[b""]].
        null_history = sum(int(value(r, "HISTORY_IN").sum()) for r in nulls)
        null_last = sum(len(bytes(value(r, "LAST_IN").reshape(-1)[0])) for r in nulls)
        batch = np.array([[len(requests), null_history, null_last]], dtype=np.int64)
        responses = []
        for request in requests:
            values = value(request, "IN")
            if 7 in values:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("seven")))
                continue
            history = value(request, "HISTORY_IN")
            last = value(request, "LAST_IN")
            seen = json.dumps(
                {
                    "history": history.tolist(),
                    "last": [bytes(b).decode() for b in last.reshape(-1)],
                    "shapes": {t.name(): list(t.shape()) for t in request.inputs()},
                },
                sort_keys=True,
            )
            outputs = [
                pb_utils.Tensor("BATCH", batch),
                pb_utils.Tensor("SEEN", np.array([[seen.encode()]], dtype=object)),
            ]
            total = int(values.sum())
            if total % 5 != 0:
                text = " ".join(str(v) for v in values.reshape(-1)).encode()
                grown = np.concatenate([history, np.array([[total]], dtype=np.int32)], axis=1)
                outputs.append(pb_utils.Tensor("HISTORY_OUT", grown))
                outputs.append(pb_utils.Tensor("LAST_OUT", np.array([[text]], dtype=object)))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses

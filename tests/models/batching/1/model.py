"""Identity that also reports how many requests shared the execute() call."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            count = np.full((x.shape[0], 1), len(requests), dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("BATCH_REQUESTS", count)]
                )
            )
        return responses

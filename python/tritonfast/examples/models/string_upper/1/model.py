"""Upper-cases every element of a BYTES tensor."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([item.upper() for item in text.flat], dtype=np.object_)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("UPPER", upper.reshape(text.shape))])
            )
        return responses

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
            half = (n / 2).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("HALF", half)]))
        return responses

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
            text = np.array([f"n={v}".encode() for v in n.flatten()], dtype=object)
            out = pb_utils.Tensor("TEXT", text.reshape(n.shape))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses

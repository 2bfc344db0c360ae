"""Counts the zero and the ones warmup samples it has seen (see config.pbtxt)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.zeros = 0
        self.ones = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if data.shape == (2, 4) and not data.any():
                self.zeros += 1
            elif data.shape == (1, 4) and (data == 1).all():
                self.ones += 1
            count = np.array([[self.zeros, self.ones]] * data.shape[0], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("COUNT", count)]))
        return responses

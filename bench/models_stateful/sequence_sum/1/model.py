import numpy as np
import triton_python_backend_utils as pb_utils


def scalar(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            total = 0
            if scalar(request, "READY"):
                corrid = scalar(request, "CORRID")
                value = scalar(request, "INPUT")
                total = value if scalar(request, "START") else self.sums[corrid] + value
                if scalar(request, "END"):
                    self.sums.pop(corrid, None)
                else:
                    self.sums[corrid] = total
            out = pb_utils.Tensor("SUM", np.array([[total]], dtype=np.int32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses

import numpy as np
import triton_python_backend_utils as pb_utils


def control(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = control(request, "CORRID")[0][0].decode()
            value = int(control(request, "INPUT")[0][0])
            start = control(request, "START")[0][0]
            total = value if start else self.sums[corrid] + value
            if control(request, "END")[0][0]:
                total += int(corrid)
                self.sums.pop(corrid, None)
            else:
                self.sums[corrid] = total
            output = np.array([[total]], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", output)]))
        return responses

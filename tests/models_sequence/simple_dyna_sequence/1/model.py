import numpy as np
import triton_python_backend_utils as pb_utils


def control(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        seen = set()
        responses = []
        for request in requests:
            corrid = int(control(request, "CORRID")[0][0])
            if corrid in seen:
                raise pb_utils.TritonModelException(f"a batch holds two requests of {corrid}")
            seen.add(corrid)
            output = control(request, "INPUT") + control(request, "START")
            if control(request, "END")[0][0]:
                output = output + np.int32(corrid)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", output.astype(np.int32))])
            )
        return responses

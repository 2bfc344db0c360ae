import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            y = x
            if x > 0:
                call = pb_utils.InferenceRequest(
                    model_name="bls_loop",
                    requested_output_names=["Y"],
                    inputs=[pb_utils.Tensor("X", np.array([x - 1], dtype=np.int32))],
                )
                answer = call.exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                y += int(pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy()[0])
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([y], dtype=np.int32))])
            )
        return responses

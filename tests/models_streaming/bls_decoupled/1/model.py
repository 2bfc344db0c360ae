import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="square_int32",
                requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                trace=request.trace(),
            )
            total = count = 0
            for answer in call.exec(decoupled=True):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                out = pb_utils.get_output_tensor_by_name(answer, "OUT")
                if out is not None:  # the last one may carry only the final flag
                    total += int(out.as_numpy()[0])
                    count += 1
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("SUM", np.array([total], dtype=np.int32)),
                        pb_utils.Tensor("COUNT", np.array([count], dtype=np.int32)),
                    ]
                )
            )
        return responses

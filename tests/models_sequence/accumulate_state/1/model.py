import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            held = pb_utils.get_input_tensor_by_name(request, "SUM_IN").as_numpy()
            total = held + value
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("SUM", total), pb_utils.Tensor("SUM_OUT", total)]
                )
            )
        return responses

"""Echoes INPUT0 and answers with the request's id and parameters as response parameters."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            params["seen_request_id"] = request.request_id()
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", tensor.as_numpy())], parameters=params
                )
            )
        return responses

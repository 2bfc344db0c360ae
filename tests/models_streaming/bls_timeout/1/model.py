"""Calls the sleeper model with the timeout (microseconds) the request asks for."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            timeout = int(json.loads(request.parameters()).get("timeout_us", 0))
            answer = pb_utils.InferenceRequest(
                model_name="sleeper",
                inputs=[pb_utils.get_input_tensor_by_name(request, "X")],
                requested_output_names=["SEEN_PARALLEL"],
                timeout=timeout,
            ).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                output = pb_utils.get_output_tensor_by_name(answer, "SEEN_PARALLEL")
                responses.append(pb_utils.InferenceResponse([output]))
        return responses

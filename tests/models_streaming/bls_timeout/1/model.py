"""Calls a sleeping model (request parameter ``callee``: ``sleeper``, the default, or the batched
``queued_sleeper``) with the timeout (microseconds) the request asks for."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            parameters = json.loads(request.parameters())
            timeout = int(parameters.get("timeout_us", 0))
            callee = parameters.get("callee", "sleeper")
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if callee == "queued_sleeper":
                x = x.reshape(1, -1)  # a batch of one
            answer = pb_utils.InferenceRequest(
                model_name=callee,
                inputs=[pb_utils.Tensor("X", x)],
                requested_output_names=["SEEN_PARALLEL"],
                timeout=timeout,
            ).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                seen = pb_utils.get_output_tensor_by_name(answer, "SEEN_PARALLEL").as_numpy()
                responses.append(
                    pb_utils.InferenceResponse(
                        [pb_utils.Tensor("SEEN_PARALLEL", np.asarray(seen).reshape(-1))]
                    )
                )
        return responses

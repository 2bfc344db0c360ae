"""SAME: input A itself; TAIL: input B without its first element (a view of B); TWICE: 2 * A."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("SAME", a),
                        pb_utils.Tensor("TAIL", b[:, 1:]),
                        pb_utils.Tensor("TWICE", a * 2),
                    ]
                )
            )
        return responses

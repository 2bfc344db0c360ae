import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, "IN")]
            # Two calls in flight at once; one read with `for` (as python_backend's async
            # bls_decoupled example reads it), the other with `async for`.
            first = await pb_utils.InferenceRequest(
                model_name="square_int32", requested_output_names=["OUT"], inputs=inputs
            ).async_exec(decoupled=True)
            second = await pb_utils.InferenceRequest(
                model_name="square_int32", requested_output_names=["OUT"], inputs=inputs
            ).async_exec(decoupled=True)
            values = [_value(answer) for answer in first]
            also = [_value(answer) async for answer in second]
            if values != also:
                raise pb_utils.TritonModelException(f"{values} != {also}")
            found = [v for v in values if v is not None]  # the last may carry only the flag
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("SUM", np.array([sum(found)], dtype=np.int32)),
                        pb_utils.Tensor("COUNT", np.array([len(found)], dtype=np.int32)),
                    ]
                )
            )
        return responses


def _value(answer):
    if answer.has_error():
        raise pb_utils.TritonModelException(answer.error().message())
    out = pb_utils.get_output_tensor_by_name(answer, "OUT")
    return None if out is None else int(out.as_numpy()[0])

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            inputs = [
                pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                pb_utils.get_input_tensor_by_name(request, "INPUT1"),
            ]
            calls = [
                pb_utils.InferenceRequest(
                    model_name=name.decode(),
                    requested_output_names=[output],
                    inputs=inputs,
                ).async_exec()
                for output in ("OUTPUT0", "OUTPUT1")
            ]
            first, second = await asyncio.gather(*calls)
            for answer in (first, second):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.get_output_tensor_by_name(first, "OUTPUT0"),
                        pb_utils.get_output_tensor_by_name(second, "OUTPUT1"),
                    ]
                )
            )
        return responses

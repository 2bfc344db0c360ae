"""Decoupled with ``async def execute``: each element of IN times ten, one response each, the
last one carrying the final flag; an IN holding a negative number fails with an error
response."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.gather(*(self._answer(request) for request in requests))
        return None

    async def _answer(self, request):
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist()
        if any(value < 0 for value in values):
            sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input")),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        for index, value in enumerate(values):
            await asyncio.sleep(0)
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if index == len(values) - 1 else 0
            out = pb_utils.Tensor("OUT", np.array([value * 10], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse([out]), flags=flags)

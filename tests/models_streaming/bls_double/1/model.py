"""BLS: sends INPUT0 (as a batch of one) to the model named by the CALLEE parameter (or the
request parameter ``callee``) with ``exec()``, and twice more at once with ``async_exec()`` on
a private event loop; answers with the sum of the three outputs. A callee error comes back as
this model's error."""

import asyncio
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.callee = config["parameters"]["CALLEE"]["string_value"]

    def execute(self, requests):
        return [self._answer(request) for request in requests]

    def _call(self, callee, values):
        return pb_utils.InferenceRequest(
            model_name=callee,
            inputs=[pb_utils.Tensor("INPUT0", values[None, :])],
            requested_output_names=["OUTPUT0"],
        )

    def _answer(self, request):
        values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        callee = json.loads(request.parameters()).get("callee", self.callee)
        first = self._call(callee, values).exec()
        if first.has_error():
            return pb_utils.InferenceResponse(error=first.error())

        async def twice():
            calls = (self._call(callee, values).async_exec() for _ in range(2))
            return await asyncio.gather(*calls)

        responses = [first, *asyncio.run(twice())]
        total = sum(
            pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()[0] for r in responses
        )
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)])

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()
            assert ready.dtype.name == "float32" and ready[0] == 1.0
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("CORRID_SEEN", corrid)]))
        return responses

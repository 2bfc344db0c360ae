"""Logs through pb_utils.Logger at every severity (see config.pbtxt)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            marker = text[0].decode()
            logger = pb_utils.Logger
            logger.log(f"{marker} info", logger.INFO)  # the level as Logger's attribute
            logger.log_warn(f"{marker} warning")
            logger.log_error(f"{marker} error")
            logger.log_verbose(f"{marker} verbose")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT_OUT", text)]))
        return responses

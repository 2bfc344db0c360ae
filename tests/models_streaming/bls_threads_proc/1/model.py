import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            thread = threading.Thread(
                target=self.answer, args=(request.get_response_sender(), value)
            )
            thread.start()
            self.threads.append(thread)
        return None  # the threads answer, and call the server, from now on

    def answer(self, sender, value):
        square = pb_utils.InferenceRequest(
            model_name="square_int32",
            requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("IN", value)],
        )
        every = list(square.exec(decoupled=True))
        add = pb_utils.InferenceRequest(
            model_name="add_sub",
            requested_output_names=["OUTPUT0"],
            inputs=[
                pb_utils.Tensor("INPUT0", np.full(4, value[0], dtype=np.float32)),
                pb_utils.Tensor("INPUT1", np.ones(4, dtype=np.float32)),
            ],
        )
        added = add.exec()
        if added.has_error():
            raise pb_utils.TritonModelException(added.error().message())
        sender.send(
            pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor("ALL", np.array([len(every)], dtype=np.int32)),
                    pb_utils.Tensor(
                        "ADDED", pb_utils.get_output_tensor_by_name(added, "OUTPUT0").as_numpy()
                    ),
                ]
            ),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def finalize(self):
        for thread in self.threads:
            thread.join()

import json
import tempfile
import time
import uuid
from pathlib import Path

import triton_python_backend_utils as pb_utils

WAIT_S = 10.0


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.peers = int(parameters["PEERS"]["string_value"])
        # Instances may run in separate processes: they meet through files, one per
        # execution, named after the request's id.
        self.place = Path(tempfile.gettempdir()) / "tritonfast-meet"
        self.place.mkdir(exist_ok=True)

    def execute(self, requests):
        (request,) = requests
        key = request.request_id()
        (self.place / f"{key}.{uuid.uuid4().hex}").touch()
        deadline = time.monotonic() + WAIT_S
        while (met := len(list(self.place.glob(f"{key}.*")))) < self.peers:
            if time.monotonic() > deadline:
                raise pb_utils.TritonModelException(f"met {met} of {self.peers} peers")
            time.sleep(0.01)
        x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("MET", x)])]

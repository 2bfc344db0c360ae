import numpy as np
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def infer_with_params_and_headers(requests):
    responses = []
    for request in requests:
        a, b = request.values()
        scaled_add = (a + b) / float(request.parameters["header_divisor"])
        scaled_sub = (a - b) * float(request.parameters["parameter_multiplier"])
        responses.append({"scaled_add": scaled_add, "scaled_sub": scaled_sub})
    return responses


with Triton(config=TritonConfig(http_header_forward_pattern="header.*")) as triton:
    triton.bind(
        model_name="ParamsAndHeaders",
        infer_func=infer_with_params_and_headers,
        inputs=[Tensor(dtype=np.float32, shape=(-1,)), Tensor(dtype=np.float32, shape=(-1,))],
        outputs=[
            Tensor(name="scaled_add", dtype=np.float32, shape=(-1,)),
            Tensor(name="scaled_sub", dtype=np.float32, shape=(-1,)),
        ],
        config=ModelConfig(max_batch_size=128),
        strict=True,
    )
    triton.serve()

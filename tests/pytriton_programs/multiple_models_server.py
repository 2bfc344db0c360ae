import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def multiply2(multiplicand):
    return [multiplicand * 2.0]


@batch
def multiply4(multiplicand):
    return [multiplicand * 4.0]


with Triton() as triton:
    for name, function in (("Multiply2", multiply2), ("Multiply4", multiply4)):
        triton.bind(
            model_name=name,
            infer_func=function,
            inputs=[Tensor(name="multiplicand", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="product", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=8),
            strict=True,
        )
    triton.serve()

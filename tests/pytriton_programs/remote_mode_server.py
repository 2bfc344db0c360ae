import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def add_sub(**inputs):
    a, b = inputs.values()
    return {"add": a + b, "sub": a - b}


with Triton() as triton:
    triton.bind(
        model_name="AddSub",
        infer_func=add_sub,
        inputs=[Tensor(dtype=np.float32, shape=(-1,)), Tensor(dtype=np.float32, shape=(-1,))],
        outputs=[
            Tensor(name="add", dtype=np.float32, shape=(-1,)),
            Tensor(name="sub", dtype=np.float32, shape=(-1,)),
        ],
        config=ModelConfig(max_batch_size=128),
    )
    triton.serve()

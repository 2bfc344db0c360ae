import numpy as np
from pytriton.decorators import batch, fill_optionals, first_value
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@fill_optionals(t=np.array([2.0], dtype=np.float32))
@batch
@first_value("w")
def add_sub(a, b, t, **inputs):
    w = inputs.get("w", 1)
    return {"add": a * w + b + t, "sub": a * w - b + t}


with Triton() as triton:
    triton.bind(
        model_name="AddSubOptional",
        infer_func=add_sub,
        inputs=[
            Tensor(name="a", dtype=np.float32, shape=(-1,)),
            Tensor(name="b", dtype=np.float32, shape=(-1,)),
            Tensor(name="t", dtype=np.float32, shape=(-1,), optional=True),
            Tensor(name="w", dtype=np.float32, shape=(-1,), optional=True),
        ],
        outputs=[
            Tensor(name="add", dtype=np.float32, shape=(-1,)),
            Tensor(name="sub", dtype=np.float32, shape=(-1,)),
        ],
        config=ModelConfig(max_batch_size=128),
    )
    triton.serve()

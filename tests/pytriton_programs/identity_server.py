import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def identity(**inputs):
    return {"OUTPUT_1": inputs["INPUT_1"], "OUTPUT_2": inputs["INPUT_2"]}


with Triton() as triton:
    triton.bind(
        model_name="Identity",
        infer_func=identity,
        inputs=[Tensor(dtype=np.float64, shape=(-1,)), Tensor(dtype=object, shape=(1,))],
        outputs=[Tensor(dtype=np.float64, shape=(-1,)), Tensor(dtype=object, shape=(1,))],
        config=ModelConfig(max_batch_size=128),
    )
    triton.serve()

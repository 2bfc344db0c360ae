import os

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import RemoteTriton


@batch
def mul(**inputs):
    a, b = inputs.values()
    return {"mul": np.multiply(a, b)}


with RemoteTriton(url=os.environ["URL"], access_token=os.environ.get("ACCESS_TOKEN")) as remote:
    remote.bind(
        model_name="Mul",
        infer_func=mul,
        inputs=[Tensor(dtype=np.float32, shape=(-1,)), Tensor(dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="mul", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=128),
    )
    remote.serve()

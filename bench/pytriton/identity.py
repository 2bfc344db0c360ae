"""A PyTriton program: an @batch identity callable (max_batch_size 64, dynamic batching
100 µs) on ports 18000-18002. Run as it is with PyTriton, or with its imports rewritten
(``pytriton.`` -> ``tritonfast.pytriton.``) under tritonfast; bench/pytriton/ab.sh does both."""

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


@batch
def identity(INPUT0):
    return {"OUTPUT0": INPUT0}


config = TritonConfig(http_port=18000, grpc_port=18001, metrics_port=18002)
with Triton(config=config) as triton:
    triton.bind(
        model_name="identity",
        infer_func=identity,
        inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(
            max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=100)
        ),
    )
    triton.serve()

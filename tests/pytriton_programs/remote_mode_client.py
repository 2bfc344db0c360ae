import os

import numpy as np
from pytriton.client import ModelClient

a = np.array([[1.0], [2.0]], dtype=np.float32)
b = np.array([[2.0], [3.0]], dtype=np.float32)
with ModelClient(os.environ["URL"], "AddSub", model_version="1", init_timeout_s=60) as client:
    assert client.infer_batch(a, b)["add"].tolist() == [[3.0], [5.0]]
with ModelClient(os.environ["URL"], "Mul", init_timeout_s=60) as client:  # bound remotely
    assert client.infer_batch(a, b)["mul"].tolist() == [[2.0], [6.0]]
print("ok")

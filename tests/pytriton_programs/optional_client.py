import os

import numpy as np
from pytriton.client import ModelClient

ones = np.ones((2, 1), dtype=np.float32)
with ModelClient(os.environ["URL"], "AddSubOptional", init_timeout_s=60) as client:
    assert client.infer_batch(ones, ones)["add"].tolist() == [[4.0], [4.0]]  # t defaults to 2
    assert client.infer_batch(a=ones, b=ones, w=ones * 3)["add"].tolist() == [[6.0], [6.0]]
    assert client.infer_batch(ones, ones, ones * 5)["sub"].tolist() == [[5.0], [5.0]]
    assert client.infer_batch(ones, ones, ones * 5, ones * 3)["add"].tolist() == [[9.0], [9.0]]
print("ok")

import os

import numpy as np
from pytriton.client import ModelClient

ones = np.ones((2, 1), dtype=np.float32)
for name, factor in (("Multiply2", 2.0), ("Multiply4", 4.0)):
    with ModelClient(os.environ["URL"], name, init_timeout_s=60) as client:
        assert client.infer_batch(ones)["product"].tolist() == [[factor]] * 2
print("ok")

import os

import numpy as np
from pytriton.client import ModelClient

a = np.array([[1.0], [2.0]], dtype=np.float32)
b = np.array([[3.0], [5.0]], dtype=np.float32)
with ModelClient(os.environ["URL"], "AddSub", init_timeout_s=60) as client:
    result = client.infer_batch(a, b)
    assert result["add"].tolist() == [[4.0], [7.0]], result
    assert result["sub"].tolist() == [[-2.0], [-3.0]], result
    sample = client.infer_sample(INPUT_1=a[0], INPUT_2=b[0])
    assert sample["add"].tolist() == [4.0], sample
print("ok")

import os

import numpy as np
from pytriton.client import ModelClient

a = np.full((2, 1), 4.0, dtype=np.float32)
b = np.full((2, 1), 1.0, dtype=np.float32)
with ModelClient(os.environ["URL"], "ParamsAndHeaders", init_timeout_s=60) as client:
    result = client.infer_batch(
        a * 2, b, parameters={"parameter_multiplier": 2}, headers={"header_divisor": 3}
    )
    assert result["scaled_add"].tolist() == [[3.0], [3.0]], result
    assert result["scaled_sub"].tolist() == [[14.0], [14.0]], result
print("ok")

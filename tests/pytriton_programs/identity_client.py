import os

import numpy as np
from pytriton.client import ModelClient

numbers = np.random.default_rng(0).random((4, 4))
words = np.array([[b"\xff\x00\x00\x00"]] * 4, dtype=object)
with ModelClient(os.environ["URL"], "Identity", init_timeout_s=60) as client:
    result = client.infer_batch(numbers, words)
    assert np.array_equal(result["OUTPUT_1"], numbers), result
    assert result["OUTPUT_2"].tolist() == words.tolist(), result
print("ok")

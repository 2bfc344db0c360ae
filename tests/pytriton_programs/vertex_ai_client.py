import json
import os
import time
import urllib.error
import urllib.request

vertex = os.environ["VERTEX_URL"]
deadline = time.monotonic() + 120
while True:  # the health route answers once the server is ready
    try:
        with urllib.request.urlopen(f"{vertex}/v2/health/ready", timeout=2) as answer:
            if answer.status == 200:
                break
    except (urllib.error.URLError, OSError):
        pass
    assert time.monotonic() < deadline, "the Vertex AI health route never answered"
    time.sleep(0.2)
body = {
    "inputs": [
        {"name": "INPUT_1", "shape": [1, 4], "datatype": "FP32", "data": [[1, 2, 3, 4]]},
        {"name": "INPUT_2", "shape": [1, 4], "datatype": "FP32", "data": [[1, 1, 1, 1]]},
    ]
}
request = urllib.request.Request(
    f"{vertex}/v2/models/AddSub/infer",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json"},
    method="POST",
)
with urllib.request.urlopen(request, timeout=30) as answer:
    outputs = {o["name"]: o["data"] for o in json.loads(answer.read())["outputs"]}
assert outputs["add"] == [2, 3, 4, 5], outputs
assert outputs["sub"] == [0, 1, 2, 3], outputs
print("ok")

"""Moving one FP32 tensor through an identity model: system shared memory vs HTTP binary vs gRPC.

One client sends requests one at a time (the tensor in, the same tensor out) and the median
time per request gives req/s and the effective rate (tensor bytes / time). Shared memory: the
input and the output live in two registered regions, nothing but JSON crosses the socket;
"shm-in-place": in one region, the output written over the input (which an identity model
leaves where it is).
With a CUDA GPU (and cuda-python) on the machine, one more path puts the input and the output
in CUDA memory shared with the server (Triton's CUDA shared-memory extension).
Run it against any Triton-compatible server, e.g. real Triton and tritonfast in turn:

    python bench/e2e/transfer.py HTTP_HOSTPORT GRPC_HOSTPORT [MODEL] [N]

MODEL (default ``identity``) takes ``INPUT0`` FP32 ``[1, n]`` and returns it as ``OUTPUT0``
(``bench/models/identity``). Prints one line per (path, size).
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Callable

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

SIZES = (("64KiB", 1 << 14), ("4MiB", 1 << 20), ("64MiB", 1 << 24))


def median_seconds(call: Callable[[], object], n: int) -> float:
    for _ in range(3):  # warm-up
        call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gpu_present() -> bool:
    try:
        from cuda.bindings import runtime
    except ImportError:
        return False
    error, count = runtime.cudaGetDeviceCount()
    return error == runtime.cudaError_t.cudaSuccess and count > 0


def placed_path(
    client: httpclient.InferenceServerClient,
    model: str,
    data: np.ndarray,
    memory: str,
    in_place: bool = False,
) -> tuple[Callable[[], object], Callable[[], None]]:
    """(one request, check-and-clean-up) with input and output in two regions of ``memory``:
    ``"system"`` (POSIX shared memory) or ``"cuda"`` (device memory on GPU 0); ``in_place``:
    in one region, the output over the input."""
    nbytes = data.nbytes
    tag = uuid.uuid4().hex[:8]
    names = ("io" + tag,) if in_place else ("in" + tag, "out" + tag)
    if memory == "cuda":
        import tritonclient.utils.cuda_shared_memory as module

        handles = [module.create_shared_memory_region(n, nbytes, 0) for n in names]
        for name, handle in zip(names, handles, strict=True):
            client.register_cuda_shared_memory(name, module.get_raw_handle(handle), 0, nbytes)
        unregister = client.unregister_cuda_shared_memory
    else:
        module = shm
        handles = [shm.create_shared_memory_region(n, f"/tfx_{n}", nbytes) for n in names]
        for name in names:
            client.register_system_shared_memory(name, f"/tfx_{name}", nbytes)
        unregister = client.unregister_system_shared_memory
    module.set_shared_memory_region(handles[0], [data])
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_shared_memory(names[0], nbytes)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    output.set_shared_memory(names[-1], nbytes)

    def finish() -> None:
        got = module.get_contents_as_numpy(handles[-1], np.float32, list(data.shape))
        try:
            if not np.array_equal(got, data):
                raise SystemExit(f"{memory} shared memory: wrong answer in the output region")
        finally:
            for name, handle in zip(names, handles, strict=True):
                unregister(name)
                module.destroy_shared_memory_region(handle)

    return lambda: client.infer(model, [tensor], outputs=[output]), finish


def main() -> None:
    http_url, grpc_url = sys.argv[1], sys.argv[2]
    model = sys.argv[3] if len(sys.argv) > 3 else "identity"
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    http = httpclient.InferenceServerClient(http_url, network_timeout=300)
    grpc = grpcclient.InferenceServerClient(grpc_url)
    http.unregister_system_shared_memory()
    cuda = gpu_present()
    if cuda:
        http.unregister_cuda_shared_memory()
    print(f"{'path':<14}{'size':>7}{'median ms':>11}{'req/s':>9}{'GB/s':>8}")
    for label, elements in SIZES:
        data = np.random.default_rng(0).random((1, elements), dtype=np.float32)
        http_input = httpclient.InferInput("INPUT0", [1, elements], "FP32")
        http_input.set_data_from_numpy(data, binary_data=True)
        http_output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        grpc_input = grpcclient.InferInput("INPUT0", [1, elements], "FP32")
        grpc_input.set_data_from_numpy(data)

        def over_http(tensor: object = http_input, output: object = http_output) -> object:
            return http.infer(model, [tensor], outputs=[output]).as_numpy("OUTPUT0")

        def over_grpc(tensor: object = grpc_input) -> object:
            return grpc.infer(model, [tensor]).as_numpy("OUTPUT0")

        placed = [
            ("shared-memory", placed_path(http, model, data, "system")),
            ("shm-in-place", placed_path(http, model, data, "system", in_place=True)),
        ]
        if cuda:
            placed.append(("cuda-shm", placed_path(http, model, data, "cuda")))
        try:
            paths = [(path, call) for path, (call, _) in placed]
            paths += [("http-binary", over_http), ("grpc", over_grpc)]
            for path, call in paths:
                seconds = median_seconds(call, n)
                rate = data.nbytes / seconds / 1e9
                print(f"{path:<14}{label:>7}{seconds * 1e3:>11.3f}{1 / seconds:>9.1f}{rate:>8.2f}")
        finally:
            for _, (_, finish) in placed:
                finish()
    grpc.close()
    http.close()


if __name__ == "__main__":
    main()

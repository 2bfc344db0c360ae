"""The gRPC frontend's floor: tritonfast's gRPC server answering ModelInfer with no model behind it.

Serves ``/inference.GRPCInferenceService/ModelInfer`` on the same core server, options, event
loop and grpcio settings as ``tritonfast serve``, but each call is answered at once with one
fixed ``ModelInferResponse`` (the identity model's answer to the load matrix's 16 FP32 values),
with no decoding, scheduling or model. What the load matrix's ``grpc-small`` rows reach against
this is the most any model can get through grpcio on the machine; the difference to the full
server is what the data plane and the model cost.

    python bench/e2e/grpc_floor.py [PORT]        (default 8001; serves until SIGINT or SIGTERM)

then drive it as the load matrix drives a server, e.g. ``h2load -t1 -c4 -m4 -D 5 -d BODY
-H content-type:application/grpc -H te:trailers
http://127.0.0.1:PORT/inference.GRPCInferenceService/ModelInfer`` with a gRPC-framed
``ModelInferRequest`` as BODY.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import numpy as np
from tritonfast.frontends.grpc.transport import start_grpcio

start_grpcio()  # before anything imports grpc, as the server does

import uvloop  # noqa: E402
from tritonfast._proto import grpc_service_pb2  # noqa: E402
from tritonfast.frontends.grpc.core import CoreServer, Method  # noqa: E402
from tritonfast.frontends.grpc.servicer import SERVER_OPTIONS  # noqa: E402

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def fixed_reply() -> bytes:
    reply = grpc_service_pb2.ModelInferResponse(model_name="identity", model_version="1")
    reply.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 16])
    reply.raw_output_contents.append(np.arange(16, dtype=np.float32).tobytes())
    return reply.SerializeToString()


async def serve(port: int) -> None:
    payload = fixed_reply()

    async def model_infer(request: bytes, context: object) -> bytes:
        return payload

    server = CoreServer(
        asyncio.get_running_loop(),
        {METHOD: Method(False, False, model_infer, None, None)},
        SERVER_OPTIONS,
    )
    if not server.add_insecure_port(f"0.0.0.0:{port}"):
        raise SystemExit(f"port {port} is taken")
    server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"serving {METHOD} on port {port}", flush=True)
    await stop.wait()
    await server.stop(1.0)


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]) if len(sys.argv) > 1 else 8001))

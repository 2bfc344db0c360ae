"""The gRPC frontend's floor: tritonfast's gRPC server answering ModelInfer with no model behind it.

Serves ``/inference.GRPCInferenceService/ModelInfer`` on the same core server, options, event
loop and grpcio settings as ``tritonfast serve``, but each call is answered at once with one
fixed ``ModelInferResponse`` (the identity model's answer to the load matrix's 16 FP32 values),
with no decoding, scheduling or model. What the load matrix's ``grpc-small`` rows reach against
this is the most any model can get through grpcio on the machine; the difference to the full
server is what the data plane and the model cost.

    python bench/e2e/grpc_floor.py [PORT] [--echo]   (default 8001; serves until SIGINT or SIGTERM)

With ``--echo`` each call is answered with its own first raw input as ``OUTPUT0`` instead,
the reply built with one copy of it (the least a server that must hand grpcio a ``bytes``
reply can do): what the large-tensor rows reach against this is grpcio's ceiling for them
(``bench/e2e/large_ceiling.py`` measures it).

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
from tritonfast.memory.bodybudget import BodyBudget  # noqa: E402

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def fixed_reply() -> bytes:
    reply = grpc_service_pb2.ModelInferResponse(model_name="identity", model_version="1")
    reply.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 16])
    reply.raw_output_contents.append(np.arange(16, dtype=np.float32).tobytes())
    return reply.SerializeToString()


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(data: memoryview, at: int) -> tuple[int, int, int, int]:
    """The protobuf field at ``at``: its number, wire type, and where its value starts and ends
    (length-delimited and varint fields only, all a ``ModelInferRequest`` holds here)."""
    key, at = _read_varint(data, at)
    number, wire = key >> 3, key & 7
    if wire == 2:
        length, start = _read_varint(data, at)
        return number, wire, start, start + length
    _, end = _read_varint(data, at)  # (wire type 0)
    return number, wire, at, end


def _read_varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


RAW_INPUT_CONTENTS = 7  # ModelInferRequest.raw_input_contents
RAW_OUTPUT_CONTENTS = 6  # ModelInferResponse.raw_output_contents


def echo_reply(request: bytes) -> bytes:
    """``OUTPUT0`` (FP32, one row) holding the request's first raw input, found in place."""
    data = memoryview(request)
    at = 0
    while at < len(data):
        number, _, start, end = _field(data, at)
        if number == RAW_INPUT_CONTENTS:
            break
        at = end
    else:
        raise ValueError("no raw input contents")
    reply = grpc_service_pb2.ModelInferResponse(model_name="identity", model_version="1")
    reply.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, (end - start) // 4])
    head = reply.SerializeToString()
    tag = _varint(RAW_OUTPUT_CONTENTS << 3 | 2) + _varint(end - start)
    return b"".join((head, tag, data[start:end]))


async def serve(port: int, echo: bool) -> None:
    payload = fixed_reply()

    async def model_infer(request: bytes, context: object) -> bytes:
        return echo_reply(request) if echo else payload

    server = CoreServer(
        asyncio.get_running_loop(),
        {METHOD: Method(False, False, model_infer, None, None)},
        SERVER_OPTIONS,
        BodyBudget(),
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
    arguments = [a for a in sys.argv[1:] if a != "--echo"]
    uvloop.run(serve(int(arguments[0]) if arguments else 8001, "--echo" in sys.argv[1:]))

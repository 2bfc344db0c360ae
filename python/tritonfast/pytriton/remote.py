"""PyTriton's remote mode: :class:`RemoteTriton` binds callables of this process to a server
that another process runs (started by that process's ``Triton``, or ``tritonfast serve
--model-control-mode explicit``).

Each bound callable is hosted here behind a local socket (``multiprocessing.connection``,
authenticated with a key of its own). The server loads, through its repository API, a
generated Python model whose instances connect to that socket and forward each batch: the
inputs, parameters and requested outputs go over, the callable runs here with the same
contract and checks as an in-process one, and its outputs (or its error) come back. Stopping
unloads the models.

The key travels as a file uploaded with the model (the server keeps it in a private
directory, and no endpoint shows a model's files), never in its configuration, which any
client can read. The socket carries typed messages only (:mod:`.remotewire`: tensors,
parameters, names, errors), never pickles: even a peer with the key can only send tensors.
"""

from __future__ import annotations

import logging
import secrets
import signal
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener, answer_challenge, deliver_challenge
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from google.protobuf import json_format

from tritonfast.backends.base import PhaseClock
from tritonfast.callables.backend import Binding, CallableInstance
from tritonfast.callables.errors import PyTritonInvalidOperationError
from tritonfast.callables.spec import ModelConfig, Tensor, model_config
from tritonfast.data.types import InferRequest, InputTensor, RequestedOutput
from tritonfast.errors import TritonError
from tritonfast.inprocess import named_tensors
from tritonfast.pytriton import remotewire
from tritonfast.pytriton.client.client import parse_url

log = logging.getLogger(__name__)

# Where the proxy model finds its key: a file uploaded with the model (in the server's private
# copy of it), never a config parameter, which any client can read.
KEY_FILE = "remote.key"

# The Python model the server loads for a remote callable: it forwards each batch. The wire
# format's module is written into it as it is, so the model needs no import of this package.
PROXY_MODEL = (
    Path(remotewire.__file__).read_text()
    + '''

# -- the proxy model ------------------------------------------------------------------------
import os
from multiprocessing.connection import Client

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Forwards each batch to a callable another process hosts (RemoteTriton)."""

    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        host, port = parameters["REMOTE_ADDRESS"]["string_value"].rsplit(":", 1)
        with open(os.path.join(os.path.dirname(__file__), "KEY_FILE")) as key_file:
            key = bytes.fromhex(key_file.read())
        self.connection = Client((host, int(port)), authkey=key)

    def execute(self, requests):
        described, arrays = [], []
        for request in requests:
            inputs = request.inputs()
            described.append(
                {
                    "inputs": [tensor.name() for tensor in inputs],
                    "parameters": json.loads(request.parameters() or "{}"),
                    "outputs": request.requested_output_names(),
                }
            )
            arrays += (tensor.as_numpy() for tensor in inputs)
        self.connection.send_bytes(encode({"requests": described}, arrays))
        header, outputs = decode(self.connection.recv_bytes())
        responses = []
        for answer in header["answers"]:
            if "error" in answer:
                error = pb_utils.TritonError(answer["error"])
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            tensors = [pb_utils.Tensor(name, outputs.pop(0)) for name in answer["outputs"]]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses

    def finalize(self):
        self.connection.close()
'''.replace("KEY_FILE", KEY_FILE)
)


class _Host:
    """One remote callable: a listening socket, one thread per connected instance."""

    def __init__(self, binding: Binding, config: Any) -> None:
        self.binding = binding
        self.config = config
        self.key = secrets.token_bytes(32)
        # No authkey here: the listener would authenticate each peer inside accept(), so one
        # peer that connects and never answers its challenge (any local process can, without
        # the key) would keep every later instance from connecting. Each peer is
        # authenticated on its own thread instead (_authenticate).
        self.listener = Listener(("127.0.0.1", 0))
        host, port = self.listener.address
        self.address = f"{host}:{port}"
        self._closing = False
        self._connections: list[Connection] = []
        self._served = 0  # peers authenticated so far: the next one's function
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="remote-host")
        self._thread.start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                connection = self.listener.accept()
            except OSError:
                if self._closing:
                    return
                continue
            threading.Thread(
                target=self._authenticate, args=(connection,), daemon=True, name="remote-call"
            ).start()

    def _authenticate(self, connection: Connection) -> None:
        """Serve ``connection`` once it proves it has the key (as ``Listener`` would check it);
        a peer without the key is dropped."""
        try:
            deliver_challenge(connection, self.key)
            answer_challenge(connection, self.key)
        except (AuthenticationError, EOFError, OSError):
            connection.close()
            return
        with self._lock:
            function = self.binding.functions[self._served % len(self.binding.functions)]
            self._served += 1
            self._connections.append(connection)
        self._serve(connection, function)

    def _serve(self, connection: Connection, function: Callable[..., Any]) -> None:
        instance = CallableInstance(function, self.binding, self.config)
        try:
            while True:
                header, arrays = remotewire.decode(connection.recv_bytes())
                results = instance.execute(self._requests(header, arrays), PhaseClock()) or []
                answers: list[dict[str, Any]] = []
                outputs: list[np.ndarray] = []
                for result in results:
                    if isinstance(result, TritonError):
                        answers.append({"error": result.message})
                    else:
                        answers.append({"outputs": [t.name for t in result.outputs]})
                        outputs += (np.asarray(t.data) for t in result.outputs)
                connection.send_bytes(remotewire.encode({"answers": answers}, outputs))
        except (EOFError, OSError):
            pass  # the server unloaded the model, or went away
        except (remotewire.WireError, KeyError, TypeError, ValueError) as error:
            log.error("model '%s': a malformed batch from the server: %s", self.binding.name, error)
        finally:
            instance.finalize()
            connection.close()

    def _requests(self, header: dict[str, Any], arrays: list[np.ndarray]) -> list[InferRequest]:
        """The batch a proxy sent, as requests for the callable."""
        requests = []
        position = 0
        for described in header["requests"]:
            names = described["inputs"]
            inputs = [
                InputTensor(str(name), "", tuple(array.shape), array)
                for name, array in zip(names, arrays[position : position + len(names)], strict=True)
            ]
            position += len(names)
            wanted = described.get("outputs")
            parameters = described.get("parameters") or {}
            if not isinstance(parameters, dict):
                raise TypeError("a request's parameters must be an object")
            requests.append(
                InferRequest(
                    self.binding.name,
                    inputs=inputs,
                    outputs=[RequestedOutput(str(name)) for name in wanted] if wanted else None,
                    parameters=parameters,
                )
            )
        return requests

    def close(self) -> None:
        self._closing = True
        self.listener.close()
        for connection in self._connections:
            connection.close()


class RemoteTriton:
    """Binds this process's callables to a server another process runs (PyTriton's
    ``RemoteTriton``)."""

    def __init__(
        self, url: str, workspace: str | Path | None = None, access_token: str | None = None
    ) -> None:
        self._scheme, self._address = parse_url(url)
        self._pending: list[tuple[Binding, Any]] = []
        self._hosts: dict[str, _Host] = {}
        self._client: Any = None
        self._running = False
        self._stopped = threading.Event()

    def _connect(self) -> Any:
        if self._client is None:
            if self._scheme == "grpc":
                import tritonclient.grpc as grpcclient

                self._client = grpcclient.InferenceServerClient(self._address)
            else:
                import tritonclient.http as httpclient

                self._client = httpclient.InferenceServerClient(self._address)
        return self._client

    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: ModelConfig | None = None,
        strict: bool = False,
        trace_config: list[str] | None = None,
    ) -> None:
        functions = [infer_func] if callable(infer_func) else list(infer_func)
        spec = config or ModelConfig()
        if spec.decoupled:
            raise PyTritonInvalidOperationError(
                "decoupled models cannot be bound remotely by tritonfast yet: bind them in the"
                " serving process"
            )
        binding = Binding(
            model_name,
            functions,
            named_tensors(inputs, "INPUT"),
            named_tensors(outputs, "OUTPUT"),
            spec,
            strict,
            on_unrecoverable=lambda text: self._stopped.set(),
        )
        proto = model_config(
            model_name, binding.inputs, binding.outputs, spec, len(functions), "python"
        )
        self._pending.append((binding, proto))
        if self._running:  # bound while running: loads at once
            self._load_pending()

    def _wait_for_server(self, timeout_s: float = 120.0) -> None:
        """Wait until the server answers (it may still be starting), as PyTriton's does."""
        client = self._connect()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if client.is_server_live():
                    return
            except Exception:  # not listening yet
                pass
            if time.monotonic() > deadline:
                raise PyTritonInvalidOperationError(
                    f"the server at {self._address} did not answer within {timeout_s:.0f} s"
                )
            time.sleep(0.1)

    def _load_pending(self) -> None:
        client = self._connect()
        while self._pending:
            binding, proto = self._pending.pop(0)
            host = _Host(binding, proto)
            proto.parameters["REMOTE_ADDRESS"].string_value = host.address
            config = json_format.MessageToJson(proto, preserving_proto_field_name=True)
            files = {
                "file:1/model.py": PROXY_MODEL.encode(),
                f"file:1/{KEY_FILE}": host.key.hex().encode(),
            }
            try:
                client.load_model(binding.name, config=config, files=files)
            except Exception as exc:
                host.close()
                raise PyTritonInvalidOperationError(
                    f"the server at {self._address} did not load model '{binding.name}': {exc}"
                ) from None
            self._hosts[binding.name] = host

    def run(self) -> None:
        """Load the bound models into the server; their callables run here from now on."""
        self._stopped.clear()
        self._running = True
        self._wait_for_server()
        self._load_pending()

    def serve(self, monitoring_period_s: float = 10.0) -> None:
        """Run until stopped, or until SIGINT or SIGTERM (from the main thread: handled here,
        so that a process started with SIGINT ignored, as a shell's background job is, still
        stops on it)."""
        self.run()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda *_: self._stopped.set())
        try:
            while not self._stopped.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()

    def stop(self) -> bool:
        """Unload the models from the server and stop hosting their callables."""
        self._stopped.set()
        self._running = False
        client = self._client
        for name, host in list(self._hosts.items()):
            if client is not None:
                try:
                    client.unload_model(name)
                except Exception as exc:  # the server may already be gone
                    log.warning("could not unload model '%s': %s", name, exc)
            host.close()
        self._hosts.clear()
        if client is not None:
            client.close()
            self._client = None
        return True

    def is_alive(self) -> bool:
        return bool(self._hosts) and not self._stopped.is_set()

    def is_connected(self) -> bool:
        return self.is_alive()

    def __enter__(self) -> RemoteTriton:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

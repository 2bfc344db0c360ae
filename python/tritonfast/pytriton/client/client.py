"""PyTriton's clients (``pytriton.client``), built on tritonclient: they talk to any server of
the protocol, tritonfast or Triton. Inputs and outputs are dicts of numpy arrays;
``infer_sample`` adds and removes the batch dimension for batching models."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlparse

import numpy as np
import tritonclient.utils
from tritonclient.utils import InferenceServerException

from tritonfast.callables.spec import Tensor
from tritonfast.pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientInvalidUrlError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)

DEFAULT_INIT_TIMEOUT_S = 300.0
DEFAULT_INFERENCE_TIMEOUT_S = 60.0
_PORTS = {"http": 8000, "grpc": 8001}


@dataclass
class ModelDescription:
    """What a client knows of a model (the fields of PyTriton's ``TritonModelConfig`` that
    clients read)."""

    model_name: str
    batching: bool
    max_batch_size: int
    inputs: list[Tensor]
    outputs: list[Tensor]
    decoupled: bool


def parse_url(url: str) -> tuple[str, str]:
    """(scheme, host:port) of ``http://``, ``grpc://`` or bare ``host[:port]`` URLs."""
    if "://" not in url:
        url = f"http://{url}"
    parsed = urlparse(url)
    if parsed.scheme not in _PORTS or not parsed.hostname:
        raise PyTritonClientInvalidUrlError(f"Invalid url {url}. Only grpc and http are supported.")
    return parsed.scheme, f"{parsed.hostname}:{parsed.port or _PORTS[parsed.scheme]}"


def _numpy_dtype(datatype: str) -> Any:
    return np.bytes_ if datatype == "BYTES" else tritonclient.utils.triton_to_np_dtype(datatype)


def _describe(config: dict[str, Any]) -> ModelDescription:
    def tensors(entries: list[dict[str, Any]]) -> list[Tensor]:
        return [
            Tensor(
                shape=tuple(int(d) for d in e.get("dims", [])),
                dtype=_numpy_dtype(e["data_type"].removeprefix("TYPE_").replace("STRING", "BYTES")),
                name=e["name"],
                optional=bool(e.get("optional", False)),
            )
            for e in entries
        ]

    batch = int(config.get("max_batch_size", 0))
    policy = config.get("model_transaction_policy") or {}
    return ModelDescription(
        config["name"],
        batch > 0,
        batch,
        tensors(config.get("input", [])),
        tensors(config.get("output", [])),
        bool(policy.get("decoupled", False)),
    )


def _check_arguments(inputs: tuple[Any, ...], named: dict[str, Any]) -> None:
    if not inputs and not named:
        raise PyTritonClientValueError("Provide input data")
    if inputs and named:
        raise PyTritonClientValueError(
            "Use either positional either keyword method arguments convention"
        )


def _check_call(
    inputs: tuple[Any, ...],
    named: dict[str, Any],
    parameters: dict[str, Any] | None,
    headers: dict[str, Any] | None,
) -> None:
    """PyTriton's checks of an inference call's arguments."""
    _check_arguments(inputs, named)
    _check_parameters(parameters)
    _check_parameters(headers)


def _check_parameters(values: dict[str, Any] | None) -> None:
    if values is None:
        return
    if not isinstance(values, dict):
        raise PyTritonClientValueError("Parameters and headers must be a dictionary")
    for key, value in values.items():
        if not isinstance(key, str):
            raise PyTritonClientValueError("Parameter/header key must be a string")
        if not isinstance(value, str | int | bool):
            raise PyTritonClientValueError(
                "Parameter/header value must be a string, integer or boolean"
            )


class ModelClient:
    """A synchronous client of one model (PyTriton's ``ModelClient``)."""

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
        model_config: ModelDescription | None = None,
        ensure_model_is_ready: bool = True,
        access_token: str | None = None,
    ) -> None:
        self._scheme, self._address = parse_url(url)
        self._model_name = model_name
        self._model_version = model_version or ""
        self._init_timeout_s = init_timeout_s or DEFAULT_INIT_TIMEOUT_S
        self._inference_timeout_s = inference_timeout_s or DEFAULT_INFERENCE_TIMEOUT_S
        self._config = model_config
        self._ready = model_config is not None and not ensure_model_is_ready
        self._headers = {"authorization": f"Bearer {access_token}"} if access_token else None
        self._ids = itertools.count(1)
        self._client: Any = self._make_client()
        if not lazy_init:
            self._init()

    def _make_client(self) -> Any:
        if self._scheme == "grpc":
            import tritonclient.grpc as grpcclient

            self._lib: Any = grpcclient
            return grpcclient.InferenceServerClient(self._address)
        import tritonclient.http as httpclient

        self._lib = httpclient
        return httpclient.InferenceServerClient(
            self._address,
            connection_timeout=self._inference_timeout_s,
            network_timeout=self._inference_timeout_s,
        )

    # -- model ---------------------------------------------------------------------------------
    def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the server and the model are ready."""
        if self._client is None:
            raise PyTritonClientClosedError("ModelClient is closed")
        deadline = time.monotonic() + timeout_s
        server_ready = False
        while True:
            try:
                server_ready = server_ready or bool(self._client.is_server_ready())
                if server_ready and self._client.is_model_ready(
                    self._model_name, self._model_version
                ):
                    return
            except (InferenceServerException, OSError):
                pass
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        # PyTriton's words
        if not server_ready:
            raise PyTritonClientTimeoutError("Waiting for server to be ready timed out.")
        version = self._model_version or "<latest>"
        raise PyTritonClientTimeoutError(
            f"Waiting for model {self._model_name}/{version} to be ready timed out."
        )

    def _init(self) -> None:
        if self._client is None:
            raise PyTritonClientClosedError("ModelClient is closed")
        if self._ready and self._config is not None:
            return
        self.wait_for_model(self._init_timeout_s)  # PyTritonClientTimeoutError, as PyTriton
        config = self._client.get_model_config(self._model_name, self._model_version)
        if self._scheme == "grpc":
            from google.protobuf import json_format

            config = json_format.MessageToDict(config.config, preserving_proto_field_name=True)
        self._config = _describe(config)
        self._ready = True

    @property
    def model_config(self) -> ModelDescription:
        self._init()
        assert self._config is not None
        return self._config

    @property
    def is_batching_supported(self) -> bool:
        return self.model_config.max_batch_size > 0

    # -- inference -----------------------------------------------------------------------------
    def infer_sample(
        self,
        *inputs: np.ndarray,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named_inputs: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """One sample (no batch dimension); a batching model gets it as a batch of one."""
        _check_call(inputs, named_inputs, parameters, headers)
        batching = self.is_batching_supported
        if batching:
            inputs = tuple(x[np.newaxis, ...] for x in inputs)
            named_inputs = {k: v[np.newaxis, ...] for k, v in named_inputs.items()}
        result = self._infer(inputs or named_inputs, parameters, headers)
        return {k: v[0] for k, v in result.items()} if batching else result

    def infer_batch(
        self,
        *inputs: np.ndarray,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named_inputs: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """A batch (first dimension) for a batching model."""
        _check_call(inputs, named_inputs, parameters, headers)
        if not self.is_batching_supported:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {self.model_config.model_name} doesn't support batching - use infer_sample"
                " method instead"
            )
        return self._infer(inputs or named_inputs, parameters, headers)

    def _request(
        self, inputs: tuple[np.ndarray, ...] | dict[str, np.ndarray]
    ) -> tuple[list[Any], list[Any]]:
        config = self.model_config
        if isinstance(inputs, tuple):
            inputs = {
                spec.name or "": data for spec, data in zip(config.inputs, inputs, strict=False)
            }
        wrapped = []
        for name, data in inputs.items():
            if data.dtype == object and not isinstance(data.reshape(-1)[0], bytes):
                raise RuntimeError(
                    f"Numpy array for {name!r} input with dtype=object should contain encoded"
                    f" strings (e.g. into utf-8). Element type: {type(data.reshape(-1)[0])}"
                )
            if data.dtype.type == np.str_:
                raise RuntimeError(
                    f"Unicode inputs are not supported. Encode numpy array for {name!r} input (ex."
                    " with np.char.encode(array, 'utf-8'))."
                )
            tensor = self._lib.InferInput(
                name, list(data.shape), tritonclient.utils.np_to_triton_dtype(data.dtype)
            )
            tensor.set_data_from_numpy(data)
            wrapped.append(tensor)
        outputs = [self._lib.InferRequestedOutput(spec.name) for spec in config.outputs]
        return wrapped, outputs

    def _infer(
        self, inputs: Any, parameters: dict[str, Any] | None, headers: dict[str, Any] | None
    ) -> dict[str, np.ndarray]:
        if self._client is None:
            raise PyTritonClientClosedError("ModelClient is closed")
        if self.model_config.decoupled:
            raise PyTritonClientInferenceServerError(
                "Model config is decoupled. Use DecoupledModelClient instead."
            )
        wrapped, outputs = self._request(inputs)
        extra = {"client_timeout": self._inference_timeout_s} if self._scheme == "grpc" else {}
        try:
            result = self._client.infer(
                model_name=self._model_name,
                model_version=self._model_version,
                inputs=wrapped,
                outputs=outputs,
                headers={**(self._headers or {}), **(headers or {})} or None,
                request_id=str(next(self._ids)),
                parameters=parameters,
                **extra,
            )
        except InferenceServerException as exc:
            if "Deadline Exceeded" in (exc.message() or ""):
                raise PyTritonClientTimeoutError(
                    f"Timeout occurred during inference request. Timeout:"
                    f" {self._inference_timeout_s} s. Message: {exc.message()}"
                ) from exc
            raise PyTritonClientInferenceServerError(
                f"Error occurred during inference request. Message: {exc.message()}"
            ) from exc
        except (TimeoutError, OSError) as exc:
            raise PyTritonClientTimeoutError(
                f"Timeout occurred during inference request. Timeout:"
                f" {self._inference_timeout_s} s Message: {exc}"
            ) from exc
        return _numpy_outputs(result, self._scheme)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def _numpy_outputs(result: Any, scheme: str) -> dict[str, np.ndarray]:
    if scheme == "grpc":
        return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


class DecoupledModelClient(ModelClient):
    """A client of a decoupled model over gRPC streaming: ``infer_sample`` / ``infer_batch``
    yield each response as it comes."""

    def __init__(
        self, url: str, model_name: str, model_version: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(url, model_name, model_version, **kwargs)
        if self._scheme != "grpc":
            raise PyTritonClientValueError(
                "DecoupledModelClient is only supported for grpc protocol"
            )
        self._busy = threading.Lock()

    def _infer(
        self, inputs: Any, parameters: dict[str, Any] | None, headers: dict[str, Any] | None
    ) -> Any:
        if self._client is None:
            raise PyTritonClientClosedError("ModelClient is closed")
        if not self.model_config.decoupled:
            raise PyTritonClientInferenceServerError(
                "Model config is coupled. Use ModelClient instead."
            )
        if parameters:
            raise PyTritonClientValueError("DecoupledModelClient does not support parameters")
        if headers:
            raise PyTritonClientValueError("DecoupledModelClient does not support headers")
        return self._stream(inputs)

    def infer_sample(
        self,
        *inputs: np.ndarray,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named_inputs: np.ndarray,
    ) -> Any:  # type: ignore[override]
        _check_arguments(inputs, named_inputs)
        batching = self.is_batching_supported
        if batching:
            inputs = tuple(x[np.newaxis, ...] for x in inputs)
            named_inputs = {k: v[np.newaxis, ...] for k, v in named_inputs.items()}
        responses = self._infer(inputs or named_inputs, parameters, headers)
        if not batching:
            return responses
        return ({k: v[0] for k, v in r.items()} for r in responses)

    def _stream(self, inputs: Any) -> Iterator[dict[str, np.ndarray]]:
        wrapped, outputs = self._request(inputs)
        items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        if not self._busy.acquire(blocking=False):
            raise PyTritonClientInferenceServerError("Inference is already in progress")
        try:
            self._client.start_stream(callback=lambda result, error: items.put((result, error)))
            self._client.async_stream_infer(
                self._model_name,
                wrapped,
                model_version=self._model_version,
                outputs=outputs,
                enable_empty_final_response=True,
            )
            while True:
                try:
                    result, error = items.get(timeout=self._inference_timeout_s)
                except queue.Empty:
                    raise PyTritonClientTimeoutError(
                        "Timeout occurred during inference request. Timeout:"
                        f" {self._inference_timeout_s} s"
                    ) from None
                if error is not None:
                    raise PyTritonClientInferenceServerError(
                        f"Error occurred during inference request. Message: {error}"
                    )
                response = result.get_response()
                if response.outputs:
                    yield _numpy_outputs(result, "grpc")
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        finally:
            self._client.stop_stream()
            self._busy.release()


class FuturesModelClient:
    """Requests from a pool of threads, each answered through a ``concurrent.futures.Future``
    (PyTriton's ``FuturesModelClient``)."""

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None = None,
        *,
        max_workers: int = 128,
        max_queue_size: int = 128,
        non_blocking: bool = False,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
    ) -> None:
        self._arguments = (url, model_name, model_version)
        self._options = {
            "init_timeout_s": init_timeout_s,
            "inference_timeout_s": inference_timeout_s,
        }
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers)
        self._local = threading.local()
        self._clients: list[ModelClient] = []
        self._lock = threading.Lock()
        self._closed = False

    def _client(self) -> ModelClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = ModelClient(*self._arguments, **self._options)  # type: ignore[arg-type]
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _submit(self, method: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        if self._closed:
            raise PyTritonClientClosedError("FutureModelClient is already closed")
        return self._pool.submit(lambda: getattr(self._client(), method)(*args, **kwargs))

    def wait_for_model(self, timeout_s: float) -> concurrent.futures.Future[Any]:
        return self._submit("wait_for_model", timeout_s)

    def model_config(self) -> concurrent.futures.Future[Any]:
        return self._pool.submit(lambda: self._client().model_config)

    def infer_sample(
        self,
        *inputs: np.ndarray,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named_inputs: np.ndarray,
    ) -> concurrent.futures.Future[Any]:
        return self._submit(
            "infer_sample", *inputs, parameters=parameters, headers=headers, **named_inputs
        )

    def infer_batch(
        self,
        *inputs: np.ndarray,
        parameters: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        **named_inputs: np.ndarray,
    ) -> concurrent.futures.Future[Any]:
        return self._submit(
            "infer_batch", *inputs, parameters=parameters, headers=headers, **named_inputs
        )

    def close(self, wait: bool = True) -> None:
        self._closed = True
        self._pool.shutdown(wait=wait)
        with self._lock:
            for client in self._clients:
                client.close()

    def __enter__(self) -> FuturesModelClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncioModelClient:
    """``async`` versions of :class:`ModelClient`'s methods, each run on a worker thread."""

    def __init__(
        self, url: str, model_name: str, model_version: str | None = None, **kwargs: Any
    ) -> None:
        self._client = ModelClient(url, model_name, model_version, **kwargs)

    async def wait_for_model(self, timeout_s: float) -> None:
        await asyncio.to_thread(self._client.wait_for_model, timeout_s)

    async def model_config(self) -> ModelDescription:
        return await asyncio.to_thread(lambda: self._client.model_config)

    async def infer_sample(self, *inputs: np.ndarray, **kwargs: Any) -> dict[str, np.ndarray]:
        return await asyncio.to_thread(self._client.infer_sample, *inputs, **kwargs)

    async def infer_batch(self, *inputs: np.ndarray, **kwargs: Any) -> dict[str, np.ndarray]:
        return await asyncio.to_thread(self._client.infer_batch, *inputs, **kwargs)

    async def close(self) -> None:
        self._client.close()

    async def __aenter__(self) -> AsyncioModelClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

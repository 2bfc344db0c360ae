"""One instance of a TensorRT engine: its own execution context and CUDA stream on its
device, device buffers per engine tensor, a whole batch per ``execute_async_v3``.

Each request's input rows are copied into the input's device buffer at their offset: from the
host, or, for an input in CUDA shared memory, device to device. The engine runs on the
instance's stream with the optimization profile that holds the batch's shapes. Outputs come
back to the host as one array per output, each request getting its rows as views, except
outputs a request placed in CUDA shared memory, copied device to device into it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import ModelInstance, PhaseClock
from tritonfast.backends.tensorrt.device import DeviceBuffer, Stream
from tritonfast.backends.tensorrt.engineio import EngineIO, select_profile, shape_text
from tritonfast.data.datatypes import NUMPY_DTYPES, WIRE_DATATYPES
from tritonfast.data.types import InferRequest, InferResponse, OutputTensor
from tritonfast.errors import InternalError, InvalidArgumentError, TritonError
from tritonfast.runtime.responses import Result

NO_DATA = np.empty(0, np.uint8)


@dataclass(frozen=True, slots=True)
class Binding:
    """A configured tensor and the engine tensor it is."""

    name: str
    datatype: str  # wire datatype
    dtype: np.dtype[Any]
    # The client's shape and the engine's (``reshape``), without the batch dimension.
    dims: tuple[int, ...]
    engine_dims: tuple[int, ...] | None


def binding(tensor: model_config_pb2.ModelInput | model_config_pb2.ModelOutput) -> Binding:
    datatype = WIRE_DATATYPES[tensor.data_type]
    reshape = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None
    return Binding(tensor.name, datatype, NUMPY_DTYPES[datatype], tuple(tensor.dims), reshape)


def is_on_device(data: Any) -> bool:
    """Whether an input's data is device memory (a CUDA shared-memory window)."""
    return not isinstance(data, np.ndarray) and hasattr(data, "address")


class TensorRTInstance(ModelInstance):
    def __init__(
        self,
        engine: Any,
        io: EngineIO,
        config: model_config_pb2.ModelConfig,
        instance_name: str,
        stream: Stream,
        profiles: list[int],
    ) -> None:
        self._name = instance_name
        self._model = config.name
        self._io = io
        self._stream = stream
        self._profiles = profiles
        self._batching = config.max_batch_size > 0
        self._inputs = {t.name: binding(t) for t in config.input}
        self._outputs = {t.name: binding(t) for t in config.output}
        # Implicit state: the sequence batcher asks for the next state by its output name.
        for state in config.sequence_batching.state:
            datatype = WIRE_DATATYPES[state.data_type]
            self._outputs[state.output_name] = Binding(
                state.output_name, datatype, NUMPY_DTYPES[datatype], tuple(state.dims), None
            )
        self._all_outputs = list(self._outputs)
        # Every engine tensor's element type, for sizing its buffer.
        self._dtypes = {
            t.name: NUMPY_DTYPES.get(WIRE_DATATYPES.get(t.config_type, ""), np.dtype(np.uint8))
            for t in io.tensors
        }
        stream.use_device()
        self._context = engine.create_execution_context()
        if self._context is None:
            raise InternalError(
                f"unable to create TensorRT context for '{config.name}' ({instance_name})"
            )
        self._profile = int(getattr(self._context, "active_optimization_profile", -1))
        self._buffers = {t.name: DeviceBuffer(stream.runtime) for t in io.tensors}

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        if not self._batching and len(requests) > 1:
            return [result for r in requests for result in self.execute([r], clock) or []]
        try:
            return self._run(requests, clock)
        except TritonError as error:
            return [error] * len(requests)

    # -- one batch ----------------------------------------------------------------------------
    def _run(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result]:
        stream = self._stream
        context = self._context
        stream.use_device()
        sizes = [r.inputs[0].shape[0] if self._batching and r.inputs else 1 for r in requests]
        rows = sum(sizes)
        shapes = {t.name: self._engine_shape(t.name, t.shape, rows) for t in requests[0].inputs}
        self._use_profile(shapes)
        keep: list[np.ndarray] = []  # host sources of queued copies, alive until the sync
        failed: dict[int, TritonError] = {}
        try:
            for name, shape in shapes.items():
                if not context.set_input_shape(name, shape):
                    raise InvalidArgumentError(
                        f"unable to set the shape {shape_text(shape)} of input '{name}' for"
                        f" '{self._model}'"
                    )
                self._copy_in(name, requests, shape, keep)
            output_shapes = self._bind_outputs()
            names = self._wanted(requests)
            failed = self._unfit_windows(requests, sizes, names, output_shapes)
            clock.inputs_ready()
            if not context.execute_async_v3(stream.address):
                raise InternalError(f"unable to run TensorRT engine of '{self._model}'")
            fetched = {
                name: self._copy_out(name, output_shapes[name], requests, sizes, failed)
                for name in names
            }
        finally:
            # Never return with copies queued that read or write request or client memory.
            stream.synchronize()
        clock.infer_done()
        responses = self._responses(requests, sizes, fetched, failed)
        return [failed.get(i, response) for i, response in enumerate(responses)]

    def _engine_shape(self, name: str, shape: tuple[int, ...], rows: int) -> tuple[int, ...]:
        """The shape the engine gets for input ``name`` of a batch of ``rows`` whose first
        request has ``shape``: its ``reshape`` when configured (-1 worked out from the
        element count)."""
        item = tuple(shape[1:] if self._batching else shape)
        plan = self._inputs.get(name)
        if plan is not None and plan.engine_dims is not None:
            dims = plan.engine_dims
            if -1 in dims:
                known = math.prod(d for d in dims if d != -1) or 1
                dims = tuple(math.prod(item) // known if d == -1 else d for d in dims)
            item = dims
        return (rows, *item) if self._batching else item

    def _use_profile(self, shapes: dict[str, tuple[int, ...]]) -> None:
        profile = select_profile(self._io, shapes, self._profiles)
        if profile is None:
            described = ", ".join(f"'{n}' {shape_text(s)}" for n, s in shapes.items())
            raise InvalidArgumentError(
                f"no optimization profile of '{self._model}' (instance '{self._name}') holds"
                f" the batch's input shapes: {described}"
            )
        if profile != self._profile:
            try:
                self._context.set_optimization_profile_async(profile, self._stream.address)
            except RuntimeError as exc:
                raise InternalError(
                    f"unable to select optimization profile {profile} of '{self._model}' for"
                    f" {self._name}: {exc}"
                ) from None
            self._profile = profile

    def _copy_in(
        self,
        name: str,
        requests: list[InferRequest],
        shape: tuple[int, ...],
        keep: list[np.ndarray],
    ) -> None:
        """Queue each request's rows of input ``name`` into its device buffer, in order."""
        expected = math.prod(shape) * self._dtypes[name].itemsize
        sources: list[Any] = []
        for request in requests:
            data: Any = next((t.data for t in request.inputs if t.name == name), None)
            if data is None:
                raise InvalidArgumentError(f"a request of the batch has no input '{name}'")
            if not is_on_device(data):
                data = np.ascontiguousarray(data)
                keep.append(data)
            sources.append(data)
        if sum(source.nbytes for source in sources) != expected:
            raise InvalidArgumentError(
                f"input '{name}': the batch's requests do not hold {shape_text(shape)} of"
                f" '{self._model}' between them"
            )
        address = self._buffers[name].ensure(expected)
        offset = 0
        for source in sources:
            if is_on_device(source):
                self._stream.device_to_device(address + offset, source.address, source.nbytes)
            else:
                self._stream.to_device(address + offset, source)
            offset += source.nbytes
        self._context.set_tensor_address(name, address)

    def _bind_outputs(self) -> dict[str, tuple[int, ...]]:
        """Every engine output's shape for this batch, each given a large enough buffer."""
        shapes = {}
        for tensor in self._io.outputs:
            shape = tuple(self._context.get_tensor_shape(tensor.name))
            if any(d < 0 for d in shape):
                raise InternalError(
                    f"output '{tensor.name}' of '{self._model}' has no shape before the run"
                    f" ({shape_text(shape)}): data-dependent output shapes are not supported"
                )
            shapes[tensor.name] = shape
            nbytes = math.prod(shape) * self._dtypes[tensor.name].itemsize
            address = self._buffers[tensor.name].ensure(nbytes)
            self._context.set_tensor_address(tensor.name, address)
        return shapes

    def _row_bytes(self, name: str, shape: tuple[int, ...]) -> int:
        """Bytes of one batch row of output ``name`` (the whole output without batching)."""
        return self._dtypes[name].itemsize * math.prod(shape[1:] if self._batching else shape)

    def _unfit_windows(
        self,
        requests: list[InferRequest],
        sizes: list[int],
        names: list[str],
        shapes: dict[str, tuple[int, ...]],
    ) -> dict[int, TritonError]:
        """The requests whose CUDA output windows cannot hold their outputs: they fail alone,
        checked before anything runs."""
        failed: dict[int, TritonError] = {}
        for index, (request, size) in enumerate(zip(requests, sizes, strict=True)):
            for name in names:
                window = (request.device_outputs or {}).get(name)
                count = size * self._row_bytes(name, shapes[name])
                if window is not None and count > window.nbytes:
                    failed[index] = InternalError(
                        f"shared memory size specified with the request for output '{name}'"
                        f" ({window.nbytes} bytes) should be at least {count} bytes to hold"
                        " the results"
                    )
        return failed

    def _copy_out(
        self,
        name: str,
        shape: tuple[int, ...],
        requests: list[InferRequest],
        sizes: list[int],
        failed: dict[int, TritonError],
    ) -> np.ndarray | None:
        """Queue the copies of output ``name``: device to device into the requests' CUDA
        windows, and to one host array when a request wants it on the host."""
        row_bytes = self._row_bytes(name, shape)
        address = self._buffers[name].address
        on_host = False
        start = 0
        for index, (request, size) in enumerate(zip(requests, sizes, strict=True)):
            count = size * row_bytes
            window = (request.device_outputs or {}).get(name)
            if window is not None:
                if index not in failed:
                    self._stream.device_to_device(window.address, address + start, count)
            elif request.outputs is None or any(o.name == name for o in request.outputs):
                on_host = True
            start += count
        if not on_host:
            return None
        host = np.empty(shape, self._dtypes[name])
        self._stream.to_host(host, address)
        return host

    def _responses(
        self,
        requests: list[InferRequest],
        sizes: list[int],
        fetched: dict[str, np.ndarray | None],
        failed: dict[int, TritonError],
    ) -> list[Result]:
        responses: list[Result] = []
        start = 0
        for index, (request, size) in enumerate(zip(requests, sizes, strict=True)):
            if index in failed:
                responses.append(failed[index])
                start += size
                continue
            wanted = None if request.outputs is None else {o.name for o in request.outputs}
            tensors = []
            for name, array in fetched.items():
                if wanted is not None and name not in wanted:
                    continue
                plan = self._outputs[name]
                dims = plan.dims if plan.engine_dims is not None else None
                if name in (request.device_outputs or {}):
                    shape = self._client_shape(name, size, dims)
                    tensors.append(
                        OutputTensor(name, plan.datatype, shape, NO_DATA, in_shared_memory=True)
                    )
                    continue
                assert array is not None
                rows = array[start : start + size] if self._batching else array
                if dims is not None:
                    rows = rows.reshape((size, *dims) if self._batching else dims)
                tensors.append(OutputTensor(name, plan.datatype, rows.shape, rows))
            responses.append(
                InferResponse(request.model_name, str(request.model_version), request.id, tensors)
            )
            start += size
        return responses

    def _client_shape(self, name: str, size: int, dims: tuple[int, ...] | None) -> tuple[int, ...]:
        """An output's shape as the client sees it, for an output written on the device."""
        engine_shape = tuple(self._context.get_tensor_shape(name))
        item = dims if dims is not None else engine_shape[1:] if self._batching else engine_shape
        return (size, *item) if self._batching else tuple(item)

    def _wanted(self, requests: list[InferRequest]) -> list[str]:
        wanted: set[str] = set()
        for request in requests:
            if request.outputs is None:
                return self._all_outputs
            wanted.update(o.name for o in request.outputs)
        return [name for name in self._all_outputs if name in wanted]

    def finalize(self) -> None:
        """Wait for the stream, drop the context, then free its buffers and the stream, on
        the instance's device."""
        stream = self._stream
        try:
            stream.use_device()
            stream.synchronize()
        except TritonError:
            pass  # a broken context: release what can be released
        self._context = None
        for buffer in self._buffers.values():
            buffer.free()
        stream.close()

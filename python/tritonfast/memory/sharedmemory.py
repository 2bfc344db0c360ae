"""Clients' shared-memory regions and the tensors requests place in them.

System regions live in the Rust core (``_core.SharedMemoryRegistry``: mapped once, bounds
checked, reference counted); CUDA regions in :mod:`.cudamemory`. Both kinds share one
namespace of region names, as in Triton.

A tensor names its place in a region with three parameters, the same in HTTP and gRPC:
``shared_memory_region``, ``shared_memory_offset`` (default 0) and ``shared_memory_byte_size``.
An input in a system region reaches the model as a read-only numpy view of the client's
memory (no copy); an output is written into its region and travels back as metadata only.
For a model in another process (a worker), a request also names where in the client's POSIX
object its large tensors lie (:class:`ObjectPlace`), so that the worker maps the object itself
and reads and writes them there: no copies between the processes either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from tritonfast._core import RegionView, SharedMemoryRegistry
from tritonfast.data import rawtensor
from tritonfast.data.types import InferRequest, InferResponse, OutputTensor
from tritonfast.errors import AlreadyExistsError, InternalError, InvalidArgumentError, NotFoundError
from tritonfast.memory.cudamemory import CudaMemory, CudaWindow

# The data of a tensor that lives in shared memory (inputs until mapped, outputs once written).
NO_DATA = np.empty(0, np.uint8)
REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
PARAMETERS = (REGION, OFFSET, BYTE_SIZE)
# Tensors from this size on get an ObjectPlace: below it a copy costs about what the system
# calls that check the object do. (The core's lanes place the tensors of the requests they
# decode from the same size on.)
PLACED_BYTES = 256 * 1024
SHM_DIR = "/dev/shm"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a tensor lives: ``byte_size`` bytes at ``offset`` of region ``region``."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class ObjectPlace:
    """Where a tensor lies in a client's POSIX shared-memory object, for another process to
    map: the object's path, its identity when it was registered (device and inode: a path may
    be reused for a new object), and ``byte_size`` bytes at ``offset`` of the object."""

    path: str
    device: int
    inode: int
    offset: int
    byte_size: int

    def still_registered(self) -> bool:
        """Whether the object at the path is still the one registered (not unlinked, not
        replaced, not a symbolic link now): only then can another process open it there."""
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        return (now.st_dev, now.st_ino) == (self.device, self.inode)


def output_too_large(name: str, byte_size: int, nbytes: int) -> InternalError:
    """Triton's error for an output of ``nbytes`` bound for a window of ``byte_size``."""
    return InternalError(
        f"shared memory size specified with the request for output '{name}' ({byte_size}"
        f" bytes) should be at least {nbytes} bytes to hold the results"
    )


def placement(parameters: dict[str, Any], tensor: str) -> Placement | None:
    """The tensor's shared-memory placement from its parameters (None: not in shared memory).

    Raises :class:`InvalidArgumentError` with Triton's messages when the parameters are
    incomplete or of the wrong type.
    """
    if REGION not in parameters:
        if OFFSET in parameters:
            raise InvalidArgumentError(
                f"'{OFFSET}' can not be specified without '{REGION}' parameter for tensor"
                f" '{tensor}'"
            )
        return None
    region = parameters[REGION]
    if type(region) is not str:
        raise InvalidArgumentError(
            f"invalid value type for '{REGION}' parameter for tensor '{tensor}', expected"
            " string_param."
        )
    if BYTE_SIZE not in parameters:
        raise InvalidArgumentError(
            f"'{BYTE_SIZE}' must be specified along with '{REGION}' parameter for tensor '{tensor}'"
        )
    numbers = []
    for key in (OFFSET, BYTE_SIZE):
        value = parameters.get(key, 0)
        if type(value) is not int or value < 0:
            raise InvalidArgumentError(
                f"invalid value type for '{key}' parameter for tensor '{tensor}', expected"
                " a non-negative int64_param."
            )
        numbers.append(value)
    return Placement(region, numbers[0], numbers[1])


class SharedMemory:
    """Every registered region, system and CUDA, and the data path through them."""

    def __init__(self, cuda: CudaMemory | None = None) -> None:
        self._system = SharedMemoryRegistry()
        self._cuda = cuda or CudaMemory()
        # System regions' objects by region name: (path, device, inode, offset of the region
        # in the object), for ObjectPlaces.
        self._objects: dict[str, tuple[str, int, int, int]] = {}

    @property
    def system_regions(self) -> SharedMemoryRegistry:
        """The system regions, as the core holds them (the models' lanes find requests'
        regions there)."""
        return self._system

    # -- the system shared-memory extension ---------------------------------------------------
    def system_status(self, name: str = "") -> list[dict[str, Any]]:
        if name and self._cuda.has(name):
            raise NotFoundError(
                f"The region named '{name}' is registered as CUDA shared memory, not system"
                " shared memory"
            )
        return self._system.status(name or None)

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if self._cuda.has(name):
            raise AlreadyExistsError(f"shared memory region '{name}' already in manager")
        self._system.register(name, key, offset, byte_size)
        found = self._system.object_of(name)  # the object as the core opened it
        self._objects.pop(name, None)
        if found is not None:
            key, offset, device, inode = found
            path = f"{SHM_DIR}/{key.removeprefix('/')}"  # the key is a checked POSIX name
            self._objects[name] = (path, device, inode, offset)

    def unregister_system(self, name: str = "") -> None:
        """Forget ``name`` (every system region if empty); unknown names are not an error."""
        if name:
            self._system.unregister(name)
            self._objects.pop(name, None)
        else:
            self._system.unregister_all()
            self._objects.clear()

    def _object_place(self, where: Placement, nbytes: int) -> ObjectPlace | None:
        """Where ``nbytes`` at ``where`` lie in the system region's object, if worth telling."""
        found = self._objects.get(where.region) if nbytes >= PLACED_BYTES else None
        if found is None:
            return None
        path, device, inode, offset = found
        return ObjectPlace(path, device, inode, offset + where.offset, nbytes)

    # -- the CUDA shared-memory extension -----------------------------------------------------
    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        if name and not self._cuda.has(name) and self._system_has(name):
            raise NotFoundError(
                f"The region named '{name}' is registered as system shared memory, not CUDA"
                " shared memory"
            )
        return self._cuda.status(name)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if self._system_has(name):
            raise AlreadyExistsError(f"shared memory region '{name}' already in manager")
        self._cuda.register(name, raw_handle, device_id, byte_size)

    def unregister_cuda(self, name: str = "") -> None:
        self._cuda.unregister(name)

    def _system_has(self, name: str) -> bool:
        try:
            self._system.status(name)
        except NotFoundError:
            return False
        return True

    # -- the data path ------------------------------------------------------------------------
    def _window(self, where: Placement, writable: bool) -> RegionView | Any:
        if self._cuda.has(where.region):
            return self._cuda.window(where.region, where.offset, where.byte_size)
        return self._system.view(where.region, where.offset, where.byte_size, writable)

    def resolve_inputs(
        self, request: InferRequest, on_device: bool = False, place_outputs: bool = True
    ) -> dict[str, tuple[Placement, Any]]:
        """Give every shared-memory input of ``request`` its data, in place.

        Returns the windows of the shared-memory outputs it asks for (checked now, so a bad
        placement fails before the model runs, and held, so an unregister while the request
        runs cannot pull the memory away).

        With ``on_device`` (a backend that takes device memory, e.g. TensorRT), an input in a
        CUDA region keeps its :class:`~tritonfast.memory.cudamemory.CudaWindow` as its data,
        and the request's ``device_outputs`` name the CUDA windows its outputs go to: the
        backend copies device to device, and the host never sees the bytes.

        ``place_outputs``: outputs may be written into their regions by a backend in another
        process (not for a model whose responses are cached: the cache needs their bytes).
        """
        model = request.model_name
        for tensor in request.inputs:
            where = placement(tensor.parameters, tensor.name)
            if where is None:
                continue
            window = self._window(where, writable=False)
            if on_device and isinstance(window, CudaWindow) and tensor.datatype != "BYTES":
                expected = (
                    rawtensor.element_count(tensor.shape, tensor.name, model, request.id)
                    * rawtensor.numeric_dtype(tensor.datatype, tensor.name, model).itemsize
                )
                if window.nbytes != expected:
                    raise rawtensor.byte_size_error(
                        tensor.name, model, request.id, expected, window.nbytes
                    )
                tensor.data = cast(Any, window)  # device memory, for device-memory backends only
                continue
            tensor.data = rawtensor.from_raw(
                tensor.datatype,
                tensor.shape,
                np.asarray(window).data,
                tensor.name,
                model,
                request.id,
            )
            if tensor.datatype != "BYTES" and not isinstance(window, CudaWindow):
                place = self._object_place(where, window.nbytes)
                if place is not None:
                    if request.input_places is None:
                        request.input_places = {}
                    request.input_places[tensor.name] = place
        outputs: dict[str, tuple[Placement, Any]] = {}
        for output in request.outputs or ():
            where = placement(output.parameters, output.name)
            if where is not None:
                window = self._window(where, writable=True)
                outputs[output.name] = (where, window)
                classified = output.parameters.get("classification")  # written as BYTES
                if on_device and isinstance(window, CudaWindow) and not classified:
                    if request.device_outputs is None:
                        request.device_outputs = {}
                    request.device_outputs[output.name] = window
                placeable = place_outputs and not (classified or request.trace)
                if placeable and not isinstance(window, CudaWindow):
                    place = self._object_place(where, window.nbytes)
                    if place is not None:
                        if request.output_places is None:
                            request.output_places = {}
                        request.output_places[output.name] = place
        return outputs

    def write_outputs(
        self, response: InferResponse, windows: dict[str, tuple[Placement, Any]]
    ) -> None:
        """Write the response's outputs that have a window into it; they keep only metadata."""
        for index, tensor in enumerate(response.outputs):
            placed = windows.get(tensor.name)
            if placed is None or tensor.in_shared_memory:  # the backend wrote it in place
                continue
            where, window = placed
            raw = rawtensor.to_raw(tensor.datatype, tensor.data)
            if isinstance(raw, bytes):
                raw = np.frombuffer(raw, np.uint8)
            if raw.nbytes > where.byte_size:
                raise output_too_large(tensor.name, where.byte_size, raw.nbytes)
            window.write(raw)
            response.outputs[index] = OutputTensor(
                tensor.name, tensor.datatype, tensor.shape, NO_DATA, in_shared_memory=True
            )

"""A tritonfast server inside a Python program: bind callables as models, serve them (and any
model repositories) over the same HTTP, gRPC and metrics endpoints as ``tritonfast serve``.

    from tritonfast import Server, ModelConfig, Tensor, batch

    @batch
    def double(x):
        return {"y": 2 * x}

    with Server(http_port=8000) as server:
        server.bind("double", double, inputs=[Tensor(shape=(-1,), dtype=np.float32, name="x")],
                    outputs=[Tensor(shape=(-1,), dtype=np.float32, name="y")],
                    config=ModelConfig(max_batch_size=64))
        server.serve()          # or server.run() to keep going in the background

The server runs on a thread of its own with its own event loop; bound callables run on their
instances' threads (or on that loop, when short), through the same schedulers as repository
models. See docs/callables.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from google.protobuf import text_format

from tritonfast.callables.backend import BACKEND_NAME, KEY_PARAMETER, Binding
from tritonfast.callables.spec import ModelConfig, Tensor, model_config
from tritonfast.cli import ServeOptions
from tritonfast.errors import InvalidArgumentError, UnavailableError
from tritonfast.memory import leftovers
from tritonfast.repository.control import ModelControl

START_TIMEOUT_S = 120.0


class _Lifecycle:
    """Carries the server thread's loop and stop event to the program's threads."""

    def __init__(self, bound: Mapping[str, object]) -> None:
        self.bound = bound  # the server's bound callables, by the key their configs name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.is_ready = threading.Event()
        self.exit_code: int | None = None
        self.control: ModelControl | None = None

    def started(self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
        self.loop, self.stop_event = loop, stop

    def ready(self, control: ModelControl) -> None:
        self.control = control
        self.is_ready.set()

    def stop(self) -> None:
        loop, event = self.loop, self.stop_event
        if loop is not None and event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(event.set)


class Server:
    """A server in this process. Keyword arguments are ``tritonfast serve``'s options
    (``http_port``, ``grpc_port``, ``metrics_port``, ``http_address``, ``log_verbose``,
    ``exit_on_error``, ``cache_config``, ...: the fields of :class:`tritonfast.cli.ServeOptions`);
    ``model_repository`` adds repositories whose models are served next to bound callables."""

    def __init__(
        self, model_repository: str | Path | Sequence[str | Path] = (), **options: Any
    ) -> None:
        known = {f.name for f in dataclasses.fields(ServeOptions)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidArgumentError(f"unknown server options: {', '.join(unknown)}")
        repositories = (
            [model_repository] if isinstance(model_repository, str | Path) else model_repository
        )
        self.options = ServeOptions(**options)
        self.options.model_repositories = [Path(r) for r in repositories]
        self._bindings: dict[str, tuple[str, Binding]] = {}
        self._bound: dict[str, object] = {}  # what the server's repository finds by key
        self._workspace: Path | None = None
        self._thread: threading.Thread | None = None
        self._lifecycle = _Lifecycle(self._bound)
        self._stop_requested = False  # by a signal during serve()
        self.unrecoverable_error: str | None = None

    # -- models ------------------------------------------------------------------------------
    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig | None = None,
        strict: bool = False,
    ) -> None:
        """Serve ``infer_func`` as model ``model_name`` (a list of callables: one instance
        each); bound while the server runs, the model loads before this returns."""
        if model_name in self._bindings:
            raise InvalidArgumentError(f"model '{model_name}' is already bound")
        functions = [infer_func] if callable(infer_func) else list(infer_func)
        if not functions:
            raise InvalidArgumentError(f"model '{model_name}': no callable to bind")
        binding = Binding(
            model_name,
            functions,
            named_tensors(inputs, "INPUT"),
            named_tensors(outputs, "OUTPUT"),
            config or ModelConfig(),
            strict,
            on_unrecoverable=self._unrecoverable,
        )
        key = uuid.uuid4().hex
        self._bindings[model_name] = (key, binding)
        control, loop = self._lifecycle.control, self._lifecycle.loop
        if self._workspace is not None and control is not None and loop is not None:
            self._write_model(self._workspace, key, binding)
            asyncio.run_coroutine_threadsafe(control.add(model_name), loop).result()

    def _write_workspace(self) -> Path:
        """The generated repository of the bound models (config.pbtxt and a version 1)."""
        workspace = Path(tempfile.mkdtemp(prefix=leftovers.temp_dir_prefix("bound")))
        for key, binding in self._bindings.values():
            self._write_model(workspace, key, binding)
        return workspace

    def _write_model(self, workspace: Path, key: str, binding: Binding) -> None:
        config = model_config(
            binding.name,
            binding.inputs,
            binding.outputs,
            binding.config,
            len(binding.functions),
            BACKEND_NAME,
        )
        config.parameters[KEY_PARAMETER].string_value = key
        (workspace / binding.name / "1").mkdir(parents=True)
        (workspace / binding.name / "config.pbtxt").write_text(text_format.MessageToString(config))
        self._bound[key] = binding

    # -- running -----------------------------------------------------------------------------
    def run(self) -> None:
        """Start serving in the background; returns once the server is ready (raises if it
        stopped while starting)."""
        if self._thread is not None:
            raise InvalidArgumentError("the server is already running")
        from tritonfast import server

        self._workspace = self._write_workspace()
        options = dataclasses.replace(self.options)
        options.model_repositories = [*self.options.model_repositories, self._workspace]
        lifecycle = self._lifecycle = _Lifecycle(self._bound)

        def main() -> None:
            lifecycle.exit_code = server.run(options, lifecycle)
            lifecycle.is_ready.set()  # wakes a run() still waiting

        self._thread = threading.Thread(target=main, name="tritonfast-server", daemon=True)
        self._thread.start()
        lifecycle.is_ready.wait(START_TIMEOUT_S)
        if lifecycle.exit_code is not None or not self._thread.is_alive():
            self._cleanup()
            raise UnavailableError(
                f"the server stopped while starting (exit status {lifecycle.exit_code}); its"
                " log says why"
            )

    def serve(self) -> None:
        """Run until SIGINT or SIGTERM (from the main thread), or until :meth:`stop`. The
        signals are taken from before the server starts: one that comes while it starts stops
        it cleanly once it has."""
        in_main = threading.current_thread() is threading.main_thread()
        previous = {}
        self._stop_requested = False
        if in_main:
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda *_: self._stop_soon())
        try:
            if self._thread is None:
                try:
                    self.run()
                except UnavailableError:
                    if self._stop_requested:  # stopped by a signal while it started
                        return
                    raise
            if self._stop_requested:  # a signal came before the server could take it
                self._lifecycle.stop()
            thread = self._thread
            assert thread is not None
            while thread.is_alive():
                thread.join(0.5)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._cleanup()

    def _stop_soon(self) -> None:
        """SIGINT or SIGTERM during :meth:`serve`: stop (now, or once the server can)."""
        self._stop_requested = True
        self._lifecycle.stop()

    def stop(self) -> None:
        """Stop serving and wait for the server to finish (requests in flight complete)."""
        self._lifecycle.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._cleanup()

    def is_alive(self) -> bool:
        return (
            self._thread is not None
            and self._thread.is_alive()
            and self._lifecycle.is_ready.is_set()
        )

    def _unrecoverable(self, text: str) -> None:
        """A callable raised an unrecoverable error: the server stops, as PyTriton's does."""
        self.unrecoverable_error = text
        self._lifecycle.stop()

    def _cleanup(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = None
        self._bound.clear()
        if self._workspace is not None:
            shutil.rmtree(self._workspace, ignore_errors=True)
            self._workspace = None

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def named_tensors(tensors: Sequence[Tensor], prefix: str) -> list[Tensor]:
    """Tensors without a name named ``<prefix>_<position from 1>``, as PyTriton names them."""
    return [
        t if t.name else dataclasses.replace(t, name=f"{prefix}_{index}")
        for index, t in enumerate(tensors, 1)
    ]

"""Starting and ending worker processes: the fork server they come from
(:func:`worker_context`), :func:`reap`, and the short-lived worker that runs a model's
``auto_complete_config`` (:func:`auto_complete_in_worker`)."""

from __future__ import annotations

import io
import multiprocessing
import os
from multiprocessing import context, forkserver, popen_forkserver, reduction, spawn, util
from pathlib import Path
from typing import Any

from tritonfast._proto import model_config_pb2
from tritonfast.backends.python import workerlog
from tritonfast.backends.python.worker import auto_complete_main
from tritonfast.errors import Code, InternalError, error_for

# How long a worker may take to start (import the model, run initialize) or to finalize.
START_TIMEOUT_S = 120.0
FINALIZE_TIMEOUT_S = 30.0

_context: Any = None


def worker_context() -> Any:
    """Where workers come from: a fork server that imported the worker's module (and numpy,
    protobuf) once, so a worker starts in milliseconds plus its model's own imports, instead
    of a fresh interpreter importing everything for each (``spawn``, the fallback where there
    is no fork server). The fork server is single-threaded, so forking it is safe."""
    global _context
    if _context is None:
        if "forkserver" in multiprocessing.get_all_start_methods():
            _context = _WorkerContext()
            _context.set_forkserver_preload(["tritonfast.backends.python.worker"])
        else:
            _context = multiprocessing.get_context("spawn")
    return _context


class _WorkerPopen(popen_forkserver.Popen):
    """Starts a worker from the fork server without the server's ``__main__``: a worker needs
    nothing from it, and a program that embeds the server (``tritonfast.Server``) must not
    run again in each worker."""

    def _launch(self, process_obj: Any) -> None:
        prepared = spawn.get_preparation_data(process_obj._name)
        prepared.pop("init_main_from_name", None)
        prepared.pop("init_main_from_path", None)
        buffer = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prepared, buffer)
            reduction.dump(process_obj, buffer)
        finally:
            context.set_spawning_popen(None)
        fds = self._fds  # type: ignore[attr-defined]  # set by popen_forkserver.Popen
        self.sentinel, writer = forkserver.connect_to_new_process(fds)
        # The child watches a duplicate of the data pipe's write end to see this process go.
        watched = os.dup(writer)
        self.finalizer = util.Finalize(
            self,
            util.close_fds,  # type: ignore[attr-defined]  # not in typeshed's stub
            (watched, self.sentinel),
        )
        with open(writer, "wb", closefd=True) as pipe:
            pipe.write(buffer.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _WorkerProcess(context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # multiprocessing calls it by this name
        return _WorkerPopen(process_obj)


class _WorkerContext(context.ForkServerContext):
    Process = _WorkerProcess


def reap(process: multiprocessing.process.BaseProcess, wait: float) -> None:
    """Waits up to ``wait`` seconds for a worker to exit, kills it if it has not, and closes
    the process object: its sentinel and the pipe end the worker watches are descriptors, held
    until then (or until the object is collected, which an error's traceback can put off for
    as long as the error is kept), so a worker failing every restart would leak two a time."""
    process.join(wait)
    if process.is_alive():
        process.kill()
        process.join()
    process.close()


def auto_complete_in_worker(model_file: Path, config: model_config_pb2.ModelConfig) -> None:
    """Import the model and run its ``auto_complete_config`` in a short-lived worker, and take
    the completed configuration back (in place): a model whose import or hook crashes its
    process fails its load, not the server."""
    context = worker_context()
    ours, theirs = context.Pipe()
    process = context.Process(
        target=auto_complete_main,
        args=(theirs, str(model_file), config.SerializeToString()),
        name=f"tritonfast-auto-complete:{config.name}",
        daemon=True,
    )
    process.start()
    theirs.close()
    try:
        reply = None
        while reply is None:
            if not ours.poll(START_TIMEOUT_S):
                raise InternalError(
                    f"model '{config.name}': importing model.py and completing its"
                    f" configuration took over {START_TIMEOUT_S:.0f} s"
                )
            message = ours.recv()
            if message[0] == "log":
                workerlog.emit(message)
            else:
                reply = message
    except (EOFError, OSError):
        process.join(5)  # the pipe closes a moment before the exit is reported
        raise InternalError(
            f"model '{config.name}': the worker process exited with code {process.exitcode}"
            " while it imported model.py and completed the model's configuration"
        ) from None
    finally:
        ours.close()
        reap(process, FINALIZE_TIMEOUT_S)
    kind, payload = reply
    if kind == "error":
        raise error_for(Code(payload[0]), payload[1])
    config.CopyFrom(model_config_pb2.ModelConfig.FromString(payload))

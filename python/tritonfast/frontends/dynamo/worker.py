"""``serve --dynamo``: the server joins an NVIDIA Dynamo deployment as a worker.

Every READY model is announced to Dynamo's discovery as a tensor model, with its Triton
configuration attached (what Dynamo's KServe frontend answers model metadata and config
from, as for Triton's own Dynamo worker), at the endpoint ``<namespace>.<server id>.<slug of
the model's name>``: workers with the same namespace and server id serve the same endpoints,
and Dynamo routes each request to one of them. A model loaded later is announced once it is
READY; one that unloads is withdrawn first. Each request becomes a request of the server's
own data plane (batching, instances, sequences, statistics and metrics apply as to any), and
its response, or a decoupled model's responses as they come, go back as Dynamo's tensor
messages (:mod:`.messages`).

Leaving without losing a request (SIGTERM, or the server stopping otherwise): every model
is withdrawn from discovery first; requests the routers still send while they notice are
answered for a grace period (Dynamo's ``DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS``, 5 s by
default, as Dynamo's own workers wait), and after it for as long as they keep coming (until
none has come for :data:`QUIET_S`, at most :data:`LINGER_LIMIT_S` more: a frontend may take
longer than the grace period to see a worker go); then the runtime stops, once the requests
it runs have finished, and only then do the models stop.

Dynamo's own environment says where discovery and the request plane are
(``DYN_DISCOVERY_BACKEND``, default ``etcd``; ``DYN_REQUEST_PLANE``, default ``tcp``; and
the variables those read, such as ``DYN_FILE_KV`` and ``ETCD_ENDPOINTS``). The server's HTTP
and gRPC endpoints stay beside it unless turned off (``--allow-http=false``, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from tritonfast.errors import InvalidArgumentError, TritonError
from tritonfast.frontends.dynamo.messages import message_of, request_of

if TYPE_CHECKING:
    from tritonfast.api.dataplane import DataPlane

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'tritonfast[dynamo]'"
GRACE_PERIOD_ENV = "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS"
DEFAULT_GRACE_PERIOD_S = 5.0
# After the grace period, a leaving worker stops once no request has come for QUIET_S, or
# LINGER_LIMIT_S later at the most.
QUIET_S = 1.0
LINGER_LIMIT_S = 20.0
# The endpoint where each worker lists the models it serves, with their configurations, for
# a ``--dynamo-route`` server (frontends/dynamo/route.py).
CATALOG_ENDPOINT = "tritonfast_catalog"


def grace_period_s() -> float:
    """How long a leaving worker still answers what the routers send (see the module
    docstring); an unreadable value is the default."""
    try:
        return max(0.0, float(os.environ.get(GRACE_PERIOD_ENV, DEFAULT_GRACE_PERIOD_S)))
    except ValueError:
        return DEFAULT_GRACE_PERIOD_S


def endpoint_name(model_name: str) -> str:
    """A Dynamo endpoint name for ``model_name``: Dynamo allows ``[a-z0-9_-]`` only, and finds
    an endpoint's registrations by prefix, so a short hash of the real name keeps one name
    from being the start of another (as Triton's Dynamo worker names them)."""
    safe = re.sub(r"[^a-z0-9_-]", "_", model_name.lower())
    return f"{safe}_{hashlib.sha256(model_name.encode()).hexdigest()[:8]}"


class DynamoWorker:
    """The server's models as Dynamo endpoints (see the module docstring)."""

    def __init__(self, dataplane: DataPlane, namespace: str, component: str) -> None:
        try:
            from dynamo.runtime import DistributedRuntime
        except ImportError:
            raise InvalidArgumentError(
                f"--dynamo needs NVIDIA Dynamo's runtime, which is not installed: {INSTALL_HINT}"
            ) from None
        self._dataplane = dataplane
        self._namespace = namespace
        self._component = component
        self._runtime = DistributedRuntime(
            asyncio.get_running_loop(),
            os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
            os.environ.get("DYN_REQUEST_PLANE", "tcp"),
        )
        # Served models: their endpoint and the task serving it.
        self._served: dict[str, tuple[Any, asyncio.Task[None]]] = {}
        # When the last request came (loop time), for a leaving worker to see them stop.
        self._arrivals = _Arrivals()
        self._syncing: asyncio.Task[None] | None = None
        self._again = False
        self._leaving = False
        self._catalog: tuple[Any, asyncio.Task[None]] | None = None

    async def start(self) -> None:
        """Announce every READY model, and list them at the catalog endpoint."""
        await self._sync()
        endpoint = self._runtime.endpoint(f"{self._namespace}.{self._component}.{CATALOG_ENDPOINT}")
        task = asyncio.ensure_future(endpoint.serve_endpoint(self._list_models))
        task.add_done_callback(lambda done: _log_end(CATALOG_ENDPOINT, done))
        self._catalog = (endpoint, task)

    async def _list_models(self, message: Any) -> AsyncIterator[dict[str, Any]]:
        """The catalog's one answer: every announced model, its endpoint, configuration (JSON)
        and READY versions."""
        from google.protobuf import json_format

        versions: dict[str, list[str]] = {}
        for entry in self._dataplane.repository_index(ready_only=True):
            if entry.get("state") == "READY" and entry.get("version"):
                versions.setdefault(entry["name"], []).append(entry["version"])
        models = []
        for name in sorted(self._served):
            config = self._dataplane.model_config(name)
            models.append(
                {
                    "name": name,
                    "endpoint": endpoint_name(name),
                    "config": json_format.MessageToJson(config, preserving_proto_field_name=True),
                    "versions": sorted(versions.get(name, []), key=int),
                }
            )
        yield {"models": models}

    def changed(self) -> None:
        """(On the event loop.) A model became READY or began to unload: announce or withdraw
        it, after whatever announcing is under way."""
        if self._leaving:
            return
        if self._syncing is not None and not self._syncing.done():
            self._again = True
            return
        self._syncing = asyncio.ensure_future(self._sync_until_settled())

    async def _sync_until_settled(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            try:
                await self._sync()
            except Exception:  # one failed announcement must not stop the next
                log.exception("announcing the models to Dynamo failed")

    async def _sync(self) -> None:
        ready = {
            entry["name"]
            for entry in self._dataplane.repository_index(ready_only=True)
            if entry.get("state") == "READY"
        }
        for name in sorted(set(self._served) - ready):
            await self._withdraw(name)
        for name in sorted(ready - set(self._served)):
            await self._announce(name)

    async def _announce(self, name: str) -> None:
        from dynamo.llm import ModelInput, ModelType, WorkerType, register_model

        path = f"{self._namespace}.{self._component}.{endpoint_name(name)}"
        endpoint = self._runtime.endpoint(path)
        config = self._dataplane.model_config(name)
        await register_model(
            ModelInput.Tensor,
            ModelType.TensorBased,
            endpoint,
            name,
            worker_type=WorkerType.Aggregated,
            tensor_model_config={
                "name": "",
                "inputs": [],
                "outputs": [],
                "triton_model_config": config.SerializeToString(),
            },
        )
        handler = _ModelHandler(
            self._dataplane, name, config.model_transaction_policy.decoupled, self._arrivals
        )
        task = asyncio.ensure_future(endpoint.serve_endpoint(handler.generate))
        task.add_done_callback(lambda done: _log_end(name, done))
        self._served[name] = (endpoint, task)
        log.info("model '%s' announced to Dynamo at %s", name, path.replace(".", "/"))

    async def _withdraw(self, name: str) -> None:
        endpoint, task = self._served.pop(name)
        await _unregister(endpoint)
        task.cancel()
        log.info("model '%s' withdrawn from Dynamo", name)

    async def stop(self) -> None:
        """Leave the deployment without losing a request (see the module docstring)."""
        self._leaving = True
        if self._syncing is not None:
            self._syncing.cancel()
        served = list(self._served.values())
        if self._catalog is not None:
            served.append(self._catalog)
        # (The worker's instances only, as Dynamo's own workers leave: its models' records
        # are shared with the other workers serving them.)
        await asyncio.gather(*(_leave(endpoint) for endpoint, _ in served))
        withdrawn = self._arrivals.count
        log.info("models withdrawn from Dynamo; answering what is still sent for %.1f s",
                 grace_period_s())  # fmt: skip
        await asyncio.sleep(grace_period_s())
        loop = asyncio.get_running_loop()
        give_up = loop.time() + LINGER_LIMIT_S
        while (quiet := loop.time() - self._arrivals.last) < QUIET_S and loop.time() < give_up:
            await asyncio.sleep(QUIET_S - quiet)
        log.info("leaving Dynamo: %d requests came after the models were withdrawn",
                 self._arrivals.count_since(withdrawn))  # fmt: skip
        self._runtime.shutdown()  # (waits for the requests it runs)
        tasks = [task for _, task in served]
        if tasks:
            await asyncio.wait(tasks)
        self._served.clear()


async def _leave(endpoint: Any) -> None:
    """Take this worker's instance of ``endpoint`` out of the routers' choice."""
    with contextlib.suppress(Exception):  # (already gone from discovery)
        await endpoint.unregister_endpoint_instance()


async def _unregister(endpoint: Any) -> None:
    """... and withdraw its model, as this worker serves it."""
    from dynamo.llm import unregister_model

    await _leave(endpoint)
    with contextlib.suppress(Exception):
        await unregister_model(endpoint)


def _log_end(name: str, task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("serving model '%s' to Dynamo failed: %s", name, task.exception())


class _Arrivals:
    """How many requests came, and when the last did (event-loop time)."""

    __slots__ = ("count", "last")

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0

    def arrived(self) -> None:
        self.count += 1
        self.last = asyncio.get_running_loop().time()

    def count_since(self, count: int) -> int:
        return self.count - count


class _ModelHandler:
    """Answers Dynamo's requests for one model through the data plane."""

    __slots__ = ("_arrivals", "_dataplane", "_decoupled", "_name")

    def __init__(
        self, dataplane: DataPlane, name: str, decoupled: bool, arrivals: _Arrivals
    ) -> None:
        self._dataplane = dataplane
        self._name = name
        self._decoupled = decoupled
        self._arrivals = arrivals

    async def generate(self, message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        self._arrivals.arrived()
        try:
            request = request_of(message, self._name)
            if not self._decoupled:
                yield message_of(await self._dataplane.infer(request, endpoint="Dynamo"))
                return
            async for item in self._dataplane.stream(request):
                result = item.result
                if isinstance(result, TritonError):
                    raise result
                if result is not None:
                    yield message_of(result)
        except TritonError as error:
            # Dynamo hands the text to the client (its frontend: as the call's error).
            raise RuntimeError(error.message) from None

"""``serve --dynamo-route``: a KServe front for a Dynamo deployment of tritonfast workers
(``serve --dynamo``), serving the full protocol through the server's own frontends: HTTP/REST
and gRPC, server metadata, the repository index, model metadata, configuration and
statistics, Triton's datatype and shape checks, binary tensors, and shared memory on the
route's host. It holds no models: every few seconds it reads each worker's catalog
(:data:`~.worker.CATALOG_ENDPOINT`) and loads each model announced there, with the worker's
configuration, as a model whose scheduler forwards each request to a worker through Dynamo's
runtime client, round robin (:mod:`.remote`); a model no worker announces any longer is
unloaded.

What a route changes in the configurations it loads: one CPU instance (it runs nothing, and
may have no GPU), no warm-up (the workers warm up) and no implicit sequence state (kept by the
worker that runs the sequence); the rest, batching included, is the
worker's and shows in the route's model configuration endpoint. A request that names a model
version goes to the version the worker's own policy serves. A sequence's requests all go to
one worker (chosen by the sequence's ID), which holds its state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonfast.backends import registry
from tritonfast.errors import InvalidArgumentError, TritonError
from tritonfast.frontends.dynamo import remote
from tritonfast.frontends.dynamo.worker import CATALOG_ENDPOINT, INSTALL_HINT

if TYPE_CHECKING:
    from tritonfast.api.dataplane import DataPlane

log = logging.getLogger(__name__)

# How often the route reads the workers' catalogs.
SYNC_S = 1.0
# The file each version directory of a route's model holds (its backend reads none).
PLACEHOLDER = "served-by-dynamo-workers"


class DynamoRoute:
    """The route's side of a deployment (see the module docstring)."""

    def __init__(
        self, dataplane: DataPlane, repository: Path, namespace: str, component: str
    ) -> None:
        """``repository``: the route's own (empty) model repository, where each routed model
        gets a directory (so that the repository index lists it)."""
        try:
            from dynamo.runtime import DistributedRuntime
        except ImportError:
            raise InvalidArgumentError(
                f"--dynamo-route needs NVIDIA Dynamo's runtime, which is not installed:"
                f" {INSTALL_HINT}"
            ) from None
        self._dataplane = dataplane
        self._repository = repository
        self._prefix = f"{namespace}.{component}"
        self._runtime = DistributedRuntime(
            asyncio.get_running_loop(),
            os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
            os.environ.get("DYN_REQUEST_PLANE", "tcp"),
        )
        # Model -> (its endpoint, the configuration JSON it was loaded with).
        self._loaded: dict[str, tuple[str, str]] = {}
        self._clients: dict[str, Any] = {}  # endpoint -> Dynamo client
        self._catalogs: Any = None
        self._syncing: asyncio.Task[None] | None = None

    async def start(self) -> None:
        remote.install(self)
        self._catalogs = await self._runtime.endpoint(f"{self._prefix}.{CATALOG_ENDPOINT}").client()
        with contextlib.suppress(Exception):  # no worker yet: the sync loop waits for them
            await asyncio.wait_for(self._catalogs.wait_for_instances(), SYNC_S * 5)
        await self._sync_once()
        self._syncing = asyncio.ensure_future(self._keep_in_sync())

    async def client_for(self, model: str) -> Any:
        """The Dynamo client of ``model``'s endpoint (made on first use)."""
        loaded = self._loaded.get(model)
        if loaded is None:
            raise TritonError(f"model '{model}' is no longer served by any Dynamo worker")
        endpoint = loaded[0]
        client = self._clients.get(endpoint)
        if client is None:
            client = await self._runtime.endpoint(f"{self._prefix}.{endpoint}").client()
            self._clients[endpoint] = client
        return client

    async def _keep_in_sync(self) -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            await self._sync_once()

    async def _sync_once(self) -> None:
        try:
            await self._sync()
        except Exception:  # a failed round must not stop the next
            log.exception("reading the Dynamo workers' catalogs failed")

    async def _announced(self) -> dict[str, dict[str, Any]]:
        """The models the workers announce now (the first worker's entry for each)."""
        models: dict[str, dict[str, Any]] = {}
        for instance in self._catalogs.instance_ids():
            try:
                stream = await self._catalogs.direct({}, instance, annotated=False)
                async for answer in stream:
                    for entry in answer.get("models", []):
                        models.setdefault(entry["name"], entry)
            except Exception as error:  # a worker that left meanwhile
                log.debug("worker %s's catalog: %s", instance, error)
        return models

    async def _sync(self) -> None:
        announced = await self._announced()
        for name in sorted(set(self._loaded) - set(announced)):
            log.info("model '%s' is no longer announced by any Dynamo worker", name)
            endpoint, _ = self._loaded.pop(name)
            self._clients.pop(endpoint, None)
            with contextlib.suppress(TritonError):
                await self._dataplane.unload_model(name)
            shutil.rmtree(self._repository / name, ignore_errors=True)
        # Ensembles after the models of their steps, which their load checks.
        ordered = sorted(announced.values(), key=lambda e: ('"ensemble' in e["config"], e["name"]))
        for entry in ordered:
            name = entry["name"]
            if self._loaded.get(name) == (entry["endpoint"], entry["config"]):
                continue
            try:
                await self._load(entry)
            except TritonError as error:
                log.error(
                    "cannot serve model '%s' from its Dynamo workers: %s", name, error.message
                )

    async def _load(self, entry: dict[str, Any]) -> None:
        name = entry["name"]
        config = json.loads(entry["config"])
        config["instance_group"] = [{"kind": "KIND_CPU", "count": 1}]
        config.pop("model_warmup", None)
        # A sequence's implicit state lives on its worker (its initial state's files too).
        config.get("sequence_batching", {}).pop("state", None)
        backend = config.get("backend")
        if backend and backend not in registry.BUILTIN:
            remote.register_name(backend)
        # A directory per version, holding a file named as the worker's model file (for the
        # checks that look for one).
        filename = config.get("default_model_filename") or PLACEHOLDER
        model_dir = self._repository / name
        shutil.rmtree(model_dir, ignore_errors=True)
        for version in entry.get("versions") or ["1"]:
            (model_dir / str(version)).mkdir(parents=True)
            (model_dir / str(version) / filename).touch()
        self._loaded[name] = (entry["endpoint"], entry["config"])
        try:
            await self._dataplane.load_model(name, {"config": json.dumps(config)})
        except TritonError:
            self._loaded.pop(name, None)
            raise
        log.info("model '%s' served from its Dynamo workers (%s)", name, entry["endpoint"])

    async def stop(self) -> None:
        if self._syncing is not None:
            self._syncing.cancel()
        self._runtime.shutdown()

"""The model repository: find models on disk, load their versions, answer who is servable.

A model is a directory holding ``config.pbtxt`` and numbered version directories. The backend
its config names (:mod:`tritonfast.backends.registry`) completes and checks the config and
creates each version's instances; the model's scheduler
(its backend's ``create_scheduler``) feeds them. A model
that fails to load (bad config, missing model file, exception while initializing) is kept
as UNAVAILABLE with its reason; the others serve normally.

Loading is split so that a reload never drops a request: :meth:`ModelRepository.prepare`
builds a new entry off the event loop (imports, ``initialize``), :meth:`ModelRepository.publish`
swaps it in on the event loop (requests arriving after that reach the new versions), and
:meth:`ModelRepository.retire` stops the replaced entry's versions, which first finish every
request already queued or running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tritonfast._core import Lane, LaneRegistry
from tritonfast._proto import model_config_pb2
from tritonfast.backends import registry
from tritonfast.backends.base import Backend, InstancePlacement, ModelInstance
from tritonfast.backends.ensemble.plan import check_composing, is_ensemble, plan_of
from tritonfast.config import load as config_load
from tritonfast.config.sequence import validate_sequence_states
from tritonfast.errors import (
    CODE_NAMES,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
)
from tritonfast.repository.dependencies import with_dependencies
from tritonfast.repository.model import ModelVersion
from tritonfast.repository.warmup import warm_up
from tritonfast.runtime import handle
from tritonfast.runtime.cache import ResponseCache
from tritonfast.runtime.handle import Handle

log = logging.getLogger(__name__)

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
UNLOADED_REASON = "unloaded"


@dataclass
class ModelEntry:
    """What the repository knows about one model directory."""

    name: str
    path: Path
    state: str = UNAVAILABLE
    reason: str = ""
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    config: model_config_pb2.ModelConfig | None = None
    # The versions the index names while none serves, as Triton's does: those an unloaded model
    # served, or those that failed to load.
    listed_versions: tuple[int, ...] = ()
    # Versions that loaded while another failed, and were stopped for it: Triton lists them
    # as UNAVAILABLE, "unloaded".
    unloaded_versions: tuple[int, ...] = ()
    # What a load request that failed answers after "load failed for model '<m>': " (the
    # reason itself, unless versions failed).
    failure: str = ""
    # Refused before any version was loaded, as Triton refuses a configuration while it
    # polls the repository (``poll_failed``: config.load.PollError) or an ensemble whose steps
    # do not fit it: the index names the model only, and the server's readiness does not
    # count it.
    unversioned: bool = False
    poll_failed: bool = False
    # False where Triton's index leaves the model out (no version to load).
    listed: bool = True
    # Named by an ensemble's step but not in the repository (a misspelt name, say): kept for
    # the ensemble's error, which quotes it; not a model of its own in the start-up table.
    missing_step: bool = False

    @property
    def default_version(self) -> ModelVersion | None:
        return self.versions[max(self.versions)] if self.versions else None


class ModelRepository:
    def __init__(
        self,
        paths: list[Path],
        loop: asyncio.AbstractEventLoop,
        *,
        strict_config: bool = False,
        latency_summaries: bool = False,
        histogram_latencies: bool = False,
        response_cache: ResponseCache | None = None,
        backend_settings: registry.BackendSettings | None = None,
        bound: Mapping[str, object] | None = None,
    ) -> None:
        self._paths = paths
        # What the program running this server bound for its models (Backend.bound).
        self._bound: Mapping[str, object] = bound if bound is not None else {}
        self._backend_settings = backend_settings or registry.BackendSettings()
        self._response_cache = response_cache
        self._loop = loop
        self._latency_summaries = latency_summaries
        self._histogram_latencies = histogram_latencies
        self._strict_config = strict_config
        self._models: dict[str, ModelEntry] = {}
        # The lanes of the models served, for the calls models make that the core takes.
        self.lane_registry = LaneRegistry()
        # Called on the event loop when a model becomes READY or begins to unload.
        self.watchers: list[Callable[[], None]] = []
        # The handle of the server these models belong to, which their code reaches (BLS,
        # ensembles): set by the server once it has one, before any model loads.
        self.server: Handle | None = None

    # -- loading ------------------------------------------------------------------------
    def discover(self) -> dict[str, Path]:
        """Model directories in every repository path, by model name."""
        found: dict[str, Path] = {}
        for root in self._paths:
            if not root.is_dir():
                raise InvalidArgumentError(f"failed to stat file {root}")
            for child in sorted(root.iterdir()):
                if child.is_dir() and not child.name.startswith("."):
                    if child.name in found:
                        raise InvalidArgumentError(
                            f"model '{child.name}' appears in multiple repositories"
                        )
                    found[child.name] = child
        return found

    def load_all(self, names: Iterable[str] | None = None) -> list[ModelEntry]:
        """Load every model found (or only ``names``, with the models their ensembles are
        made of) at start-up, each ensemble after its step models; returns all entries."""
        found = self.discover()
        asked = set(found if names is None else names)
        for name in with_dependencies(found if names is None else names, found):
            if name not in found:
                entry = ModelEntry(name=name, path=Path(name), missing_step=name not in asked)
                entry.reason = f"failed to load '{name}', no version is available"
                self._models[name] = entry
                continue
            self.publish(self.prepare(name, found[name]))
        return self.entries()

    def prepare(
        self, name: str, model_dir: Path, config: model_config_pb2.ModelConfig | None = None
    ) -> ModelEntry:
        """Build a new entry for ``model_dir`` (its ``config.pbtxt``, or ``config`` instead),
        READY or UNAVAILABLE with the reason. Blocking: imports and initializes the model.
        Nothing serves it until :meth:`publish`."""
        entry = ModelEntry(name=name, path=model_dir, state=LOADING)
        try:
            self._load_versions(entry, config)
            entry.state = READY
            log.info("successfully loaded '%s' version(s) %s", name, sorted(entry.versions))
        except _VersionsFailed as failed:
            # As Triton words a failure of the model's versions (its backend's, not its
            # configuration's): the index lists them with "<Code>: <message>".
            self._stop_versions(entry, served=False)
            error = failed.error
            reason = f"{CODE_NAMES[error.code]}: {error.message}"
            entry.state, entry.reason = UNAVAILABLE, reason
            entry.listed_versions = failed.versions
            entry.unloaded_versions = failed.others
            entry.failure = "".join(
                f"version {v} is at UNAVAILABLE state: {reason};\n" for v in failed.versions
            )
            for version in failed.versions:
                log.error("failed to load '%s' version %d: %s", name, version, reason)
        except _NoVersions as exc:
            entry.state, entry.reason, entry.unversioned = UNAVAILABLE, exc.message, True
            entry.failure, entry.listed = f"{exc.message}\n", False
            log.error("failed to load model '%s': %s", name, exc.message)
        except config_load.PollError as exc:
            self._stop_versions(entry, served=False)
            entry.state, entry.reason = UNAVAILABLE, exc.message
            entry.unversioned = entry.poll_failed = True
            log.error("Poll failed for model directory '%s': %s", name, exc.message)
        except _EnsembleRefused as refused:
            entry.state, entry.reason, entry.unversioned = UNAVAILABLE, str(refused), True
            entry.failure = f"{refused}\n"  # Triton's answer ends with a line break
            log.error("failed to load '%s': %s", name, refused)
        except TritonError as exc:
            self._stop_versions(entry, served=False)
            entry.state, entry.reason = UNAVAILABLE, exc.message
            log.error("failed to load '%s': %s", name, exc.message)
        return entry

    def publish(self, entry: ModelEntry) -> ModelEntry | None:
        """Serve ``entry`` from now on (call on the event loop); returns the entry it replaces,
        whose versions the caller must :meth:`retire`."""
        previous = self._models.get(entry.name)
        self._models[entry.name] = entry
        self._register_lanes(entry)
        return previous

    def _register_lanes(self, entry: ModelEntry) -> None:
        """Calls to ``entry``'s model that the core takes (BLS) go to its versions' lanes from
        now on (none while it is not READY: such calls go through Python, which refuses them
        as Triton does)."""
        lanes = {}
        if entry.state == READY:
            for number, version in entry.versions.items():
                lane = version.http_lane
                if type(lane) is Lane:
                    lanes[str(number)] = lane
        default = str(max(entry.versions)) if entry.versions else ""
        self.lane_registry.set(entry.name, lanes, default)
        for changed in self.watchers:
            self._loop.call_soon_threadsafe(changed)

    def retire(self, entry: ModelEntry, timeout: float) -> None:
        """Stop a replaced or unloaded entry: its queued and running requests finish first.
        Blocking."""
        self._stop_versions(entry, timeout)

    def begin_unload(self, name: str) -> ModelEntry | None:
        """Stop serving ``name`` (call on the event loop); returns its entry, now UNLOADING, to
        :meth:`retire` and then mark with :meth:`finish_unload`."""
        entry = self._models.get(name)
        if entry is None:
            return None
        if entry.state != READY:  # a failed (or already unloaded) model: nothing runs
            entry.state, entry.reason, entry.unversioned = UNAVAILABLE, UNLOADED_REASON, False
            return None
        unloading = ModelEntry(
            name,
            entry.path,
            UNLOADING,
            config=entry.config,
            listed_versions=tuple(sorted(entry.versions)),
        )
        self._models[name] = unloading
        self._register_lanes(unloading)
        return entry

    def finish_unload(self, name: str) -> None:
        entry = self._models.get(name)
        if entry is not None and entry.state == UNLOADING:
            entry.state, entry.reason = UNAVAILABLE, UNLOADED_REASON

    def _check_ensemble(self, config: model_config_pb2.ModelConfig) -> None:
        """Triton's load-time checks of an ensemble against its step models, which must be
        loaded first."""
        plan = plan_of(config)
        found = self.discover()
        missing = [m for m in plan.models() if m not in found and m not in self._models]
        if missing:
            raise InvalidArgumentError(
                f"ensemble {config.name} contains models that are not available or ambiguous:"
                f" {', '.join(missing)}"
            )
        configs: dict[str, model_config_pb2.ModelConfig] = {}
        for step in plan.steps:
            entry = self._models.get(step.model_name)
            if entry is None or entry.state != READY or entry.config is None:
                failed = ""
                if entry is not None and entry.reason:
                    failed = f" Model '{step.model_name}' loading failed with error: {entry.reason}"
                raise InvalidArgumentError(
                    f"ensemble '{config.name}' depends on '{step.model_name}' which has no loaded"
                    f" version.{failed}"
                )
            if step.model_version and int(step.model_version) not in entry.versions:
                raise InvalidArgumentError(
                    f"ensemble '{config.name}' depends on '{step.model_name}' whose required"
                    f" version {step.model_version} is not loaded."
                )
            configs[step.model_name] = entry.config
        check_composing(plan, config, configs)
        # As in Triton: an ensemble with a decoupled step is decoupled (its responses stream).
        if any(c.model_transaction_policy.decoupled for c in configs.values()):
            config.model_transaction_policy.decoupled = True

    def dependents(self, name: str) -> list[str]:
        """The loaded ensembles that have a step on ``name``."""
        return [
            entry.name
            for entry in self._models.values()
            if entry.state == READY
            and entry.config is not None
            and name in plan_models(entry.config)
        ]

    def _load_versions(
        self, entry: ModelEntry, override: model_config_pb2.ModelConfig | None = None
    ) -> None:
        model_dir = entry.path
        if override is None:
            config = config_load.read_config(model_dir, required=self._strict_config)
        else:
            config = model_config_pb2.ModelConfig()
            config.CopyFrom(override)
        config_load.fill_defaults(config, model_dir)
        config_load.validate_identity(config, model_dir)
        versions = _select_versions(config, model_dir)
        try:
            backend_class = registry.lookup(config)
        except InvalidArgumentError as exc:
            # Triton's poll-time refusals come first; then a platform it does not know is one
            # of them, while a backend library it cannot find fails the versions.
            config_load.validate(config, model_dir)
            if isinstance(exc, registry.UnknownPlatformError):
                raise config_load.PollError(exc.message) from exc
            raise _VersionsFailed(tuple(versions), exc) from exc
        backend = backend_class(model_dir, self._backend_settings.for_backend(backend_class.name))
        backend.bound = self._bound
        if not self._strict_config:
            try:
                backend.auto_complete(config, max(versions))
            except TritonError as exc:  # the backend's: Triton reports it for each version
                raise _VersionsFailed(tuple(versions), exc) from exc
        config_load.validate(config, model_dir)
        backend.validate(config)
        if is_ensemble(config):
            try:
                self._check_ensemble(config)
            except TritonError as exc:
                raise _EnsembleRefused(exc.message) from exc
        try:
            config_load.validate_io(config)
            validate_sequence_states(config, model_dir)
        except TritonError as exc:  # Triton fails every version with these
            raise _VersionsFailed(tuple(versions), exc) from exc
        cached = self._response_cache is not None and config.response_cache.enable
        if cached and config.HasField("sequence_batching"):
            raise InvalidArgumentError(
                f"Response Cache does not currently support model {config.name} with"
                " sequence batching scheduler. Please disable the response cache."
            )
        config_load.complete(
            config, backend.default_model_filename, backend.default_cpu_instance_count
        )
        if backend.platforms and not is_ensemble(config):
            # As Triton names them: e.g. backend onnxruntime, platform onnxruntime_onnx.
            config.backend = config.backend or backend.name
            config.platform = config.platform or backend.platforms[0]
        entry.config = config
        for version in versions:
            log.info("loading: %s:%d", config.name, version)  # as Triton says it
            try:
                entry.versions[version] = self._start_version(backend, config, version, versions)
            except TritonError as exc:
                others = tuple(v for v in versions if v != version)
                raise _VersionsFailed((version,), exc, others) from exc

    def _start_version(
        self,
        backend: Backend,
        config: model_config_pb2.ModelConfig,
        version: int,
        served: list[int],
    ) -> ModelVersion:
        instances: list[ModelInstance] = []
        try:
            with handle.serving(self.server):  # initialize() and warm-up may call the server
                self._create_instances(backend, config, version, instances)
                warm_up(config, instances, backend.model_dir)
            scheduler = backend.create_scheduler(
                f"{config.name}_{version}",
                config,
                instances,
                self._loop,
                server=self.server,
                version=version,
                latency_summaries=self._latency_summaries,
                histogram_latencies=self._histogram_latencies,
                loop_execution=backend.runs_on_event_loop(config),
            )
        except BaseException:
            for started in instances:  # worker processes and their segments must not leak
                started.finalize()
            raise
        cache = None
        if config.response_cache.enable and not config.model_transaction_policy.decoupled:
            cache = self._response_cache
        return ModelVersion(
            config,
            version,
            scheduler,
            served,
            backend.model_dir,
            cache,
            takes_device_memory=backend.takes_device_memory,
        )

    @staticmethod
    def _create_instances(
        backend: Backend,
        config: model_config_pb2.ModelConfig,
        version: int,
        instances: list[ModelInstance],
    ) -> None:
        """Every instance of every group, into ``instances`` as each starts (so that a
        failure can finalize those that did)."""
        for group in config.instance_group:
            kind = model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)
            device_ids = list(group.gpus) or [0]
            for index in range(group.count or 1):
                placement = InstancePlacement(
                    name=f"{group.name}_{index}",
                    version=version,
                    kind=kind.removeprefix("KIND_"),
                    device_id=device_ids[index % len(device_ids)],
                    profiles=tuple(group.profile),
                )
                try:
                    instances.append(backend.create_instance(config, placement))
                except TritonError as exc:
                    log.error(
                        "Failed to initialize model instance '%s': %s",
                        placement.name,
                        exc.message,
                    )
                    raise

    # -- queries ------------------------------------------------------------------------
    def entries(self) -> list[ModelEntry]:
        return sorted(self._models.values(), key=lambda e: e.name)

    def entry(self, name: str) -> ModelEntry | None:
        return self._models.get(name)

    def get(self, name: str, version: str = "") -> ModelVersion:
        number = parse_version(version)
        entry = self._models.get(name)
        if entry is None:
            raise NotFoundError(f"Request for unknown model: '{name}' is not found")
        if entry.state != READY:
            if entry.config is None:  # never got as far as a parsed configuration
                raise NotFoundError(f"Request for unknown model: '{name}' is not found")
            if number is None:
                raise NotFoundError(
                    f"Request for unknown model: '{name}' has no available versions"
                )
            if number in entry.listed_versions or number in entry.unloaded_versions:
                raise UnavailableError(
                    f"Request for unknown model: '{name}' version {number} is not at ready state"
                )
            raise NotFoundError(
                f"Request for unknown model: '{name}' version {number} is not found"
            )
        chosen = entry.default_version if number is None else entry.versions.get(number)
        if chosen is None:
            raise NotFoundError(
                f"Request for unknown model: '{name}' version {number} is not found"
            )
        return chosen

    def serving(self, name: str = "", version: str = "") -> list[ModelVersion]:
        """The loaded versions a statistics request names (all of them without a name)."""
        if not name:
            return [v for e in self.entries() for _, v in sorted(e.versions.items())]
        number = parse_version(version)
        entry = self._models.get(name)
        if entry is None or entry.state != READY:
            raise InvalidArgumentError(f"requested model '{name}' is not available")
        if number is None:
            return [v for _, v in sorted(entry.versions.items())]
        chosen = entry.versions.get(number)
        if chosen is None:
            raise InvalidArgumentError(
                f"requested model version is not available for model '{name}'"
            )
        return [chosen]

    def is_ready(self, name: str, version: str = "") -> bool:
        parse_version(version)  # a malformed version is an error, not "not ready"
        try:
            self.get(name, version)
        except TritonError:
            return False
        return True

    def all_ready(self) -> bool:
        """Every model that is meant to serve is READY (unloaded ones do not count)."""
        return all(
            e.state == READY or e.reason == UNLOADED_REASON or e.unversioned
            for e in self._models.values()
        )

    # -- shutdown -----------------------------------------------------------------------
    def stop(self, timeout: float) -> None:
        """Stop every model, waiting at most ``timeout`` seconds in all for running requests."""
        deadline = time.monotonic() + timeout
        for entry in self._models.values():
            self._stop_versions(entry, deadline - time.monotonic())

    def _stop_versions(
        self, entry: ModelEntry, timeout: float = 5.0, *, served: bool = True
    ) -> None:
        """Stop the entry's versions, waiting at most ``timeout`` seconds in all for their
        running requests (``served``: they were serving, and the log says so)."""
        deadline = time.monotonic() + timeout
        for number, version in entry.versions.items():
            version.stop(max(0.0, deadline - time.monotonic()))
            if served:
                log.info("successfully unloaded '%s' version %d", entry.name, number)
        entry.versions.clear()


def _version_numbers(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def _select_versions(config: model_config_pb2.ModelConfig, model_dir: Path) -> list[int]:
    """The versions the model's version_policy serves (latest 1 by default)."""
    available = _version_numbers(model_dir)
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        chosen = available
    elif which == "specific":
        chosen = [v for v in available if v in set(policy.specific.versions)]
    else:
        count = policy.latest.num_versions if which == "latest" else 1
        chosen = available[-max(count, 1) :]
    if not chosen:
        raise _NoVersions(
            f"at least one version must be available under the version policy of model"
            f" '{config.name}'"
        )
    return chosen


def plan_models(config: model_config_pb2.ModelConfig) -> set[str]:
    """The models of an ensemble config's steps (none for other models)."""
    return {step.model_name for step in config.ensemble_scheduling.step}


_INT64_MAX = (1 << 63) - 1


def parse_version(text: str) -> int | None:
    """A requested version string as Triton reads it (C's ``stol``: leading blanks, a sign,
    then the leading digits; the rest ignored); None for "" (the model's default version)."""
    if not text:
        return None
    digits = text.lstrip(" \t\n\r\f\v")
    sign = -1 if digits[:1] == "-" else 1
    if digits[:1] in "+-":
        digits = digits[1:]
    count = len(digits) - len(digits.lstrip("0123456789"))
    if count == 0 or int(digits[:count]) > _INT64_MAX + (sign < 0):
        raise InvalidArgumentError(
            f"failed to get model version from specified version string '{text}'"
            " (details: stol), version should be an integral value > 0"
        )
    number = sign * int(digits[:count])
    if number < 0:
        raise InvalidArgumentError(
            f"invalid model version specified '{text}' , version should be an integral value > 0"
        )
    return number


class _EnsembleRefused(Exception):
    """An ensemble whose steps do not fit it (their inputs, types, batch sizes, or a step
    model that is not there), found when it is loaded."""


class _NoVersions(InvalidArgumentError):
    """The version policy leaves nothing to load: Triton answers the load with the message and
    a line break and leaves the model out of the repository index."""


class _VersionsFailed(Exception):
    """Loading failed in the model's versions (its backend's auto-complete, an instance's
    initialize, warmup), not in reading its configuration."""

    def __init__(
        self, versions: tuple[int, ...], error: TritonError, others: tuple[int, ...] = ()
    ) -> None:
        super().__init__(error.message)
        self.versions = versions
        self.error = error
        self.others = others  # the model's other versions, stopped for this failure

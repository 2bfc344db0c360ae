"""Model control: which models load at start-up, and loading / unloading while serving.

``--model-control-mode``:

- ``none`` (default): every model in the repository loads at start-up; the repository API
  cannot load or unload.
- ``explicit``: only the ``--load-model`` names load at start-up (``*``: all); the repository
  API loads, reloads and unloads.
- ``poll``: like ``none`` at start-up, then every ``--repository-poll-secs`` the repository is
  rescanned: new models load, removed ones unload, changed ones reload.

A reload never drops a request: the new versions are built beside the old ones, swapped in on
the event loop, and the old ones finish what they had queued before they stop. A reload that
fails leaves the serving versions in place.

An ensemble that was serving when a model of one of its steps was unloaded (explicit mode) or
left the repository (poll mode) is unloaded with it and loaded again, by itself, once every
model of its steps is loaded again, as Triton 2.51 does; one unloaded by name is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import shutil
import tempfile
from collections.abc import Coroutine, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from google.protobuf import json_format

from tritonfast._proto import model_config_pb2
from tritonfast.errors import InternalError, InvalidArgumentError, TritonError, UnavailableError
from tritonfast.memory import leftovers
from tritonfast.repository.dependencies import composing_models
from tritonfast.repository.manager import (
    READY,
    UNAVAILABLE,
    UNLOADED_REASON,
    ModelEntry,
    ModelRepository,
    plan_models,
)

log = logging.getLogger(__name__)

NONE, POLL, EXPLICIT = "none", "poll", "explicit"
MODES = (NONE, POLL, EXPLICIT)
FILE_PREFIX = "file:"


class ModelControl:
    def __init__(
        self,
        repository: ModelRepository,
        mode: str = NONE,
        *,
        load_models: list[str] | None = None,
        poll_secs: float = 15.0,
        exit_timeout: float = 30.0,
    ) -> None:
        if mode not in MODES:
            raise InvalidArgumentError(f"unknown model control mode '{mode}'")
        self.repository = repository
        self.mode = mode
        self._load_models = list(load_models or [])
        self._poll_secs = poll_secs
        self._exit_timeout = exit_timeout
        self._locks: dict[str, asyncio.Lock] = {}
        self._fingerprints: dict[str, str] = {}
        # What each loaded model was loaded from (a fingerprint of its directory; "" when
        # from a configuration or files in the request): an unchanged one is not reloaded.
        self._loaded_from: dict[str, str] = {}
        self._temp_dirs: dict[str, Path] = {}
        self._operations: set[asyncio.Future[None]] = set()
        # Models whose load is under way (an ensemble's steps that are part of a cycle are not
        # loaded again from inside their own load).
        self._in_load: set[str] = set()
        # The ensembles that were serving until a model of one of their steps went away, with
        # the models of their steps. Triton keeps such an ensemble in its dependency graph and
        # loads it again once all of them are back (core's model_repository_manager.cc:
        # RemoveNodes leaves the ensemble's node in place, AddNodes / UpdateNodes re-check it);
        # an ensemble unloaded by name leaves the graph, and waits for nothing.
        self._waiting: dict[str, set[str]] = {}
        # The "config" parameter a model was loaded with (instead of its config.pbtxt): a
        # waiting ensemble is loaded again with it, as Triton keeps its configuration.
        self._config_parameters: dict[str, Any] = {}

    # -- start-up -----------------------------------------------------------------------------
    def startup(self) -> list[ModelEntry]:
        """Load what the mode loads at start-up (blocking); returns the entries."""
        if self.mode == EXPLICIT:
            wanted = self._load_models
            if "*" in wanted and len(set(wanted)) > 1:
                raise InvalidArgumentError(
                    "Wildcard model name '*' must be the ONLY startup model if specified at all."
                )
            names = None if "*" in wanted else list(dict.fromkeys(wanted))
            entries = self.repository.load_all(names)
        else:
            if self._load_models:
                log.warning("--load-model is ignored unless --model-control-mode=explicit")
            entries = self.repository.load_all()
        # One pass over the directories: the loaded models' fingerprints, and in poll mode
        # everyone's (the baseline the first poll compares with).
        loaded = {e.name for e in entries}
        prints = {
            name: _fingerprint(path)
            for name, path in self.repository.discover().items()
            if self.mode == POLL or name in loaded
        }
        self._loaded_from = {name: prints[name] for name in loaded if name in prints}
        if self.mode == POLL:
            self._fingerprints = prints
        return entries

    # -- the repository API ---------------------------------------------------------------------
    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model directory in the repository with its versions' state, as Triton lists
        them: by name then version; a model never loaded is just its name; an empty reason is
        left out (models loaded from uploaded files only are served but not listed)."""
        rows: list[dict[str, str]] = []
        for name in sorted(self.repository.discover()):
            entry = self.repository.entry(name)
            if entry is not None and not entry.listed:
                continue
            if entry is None or entry.unversioned:
                if not ready_only:
                    rows.append({"name": name})
                continue
            if ready_only and entry.state != READY:
                continue
            listed = [*(sorted(entry.versions) or entry.listed_versions)]
            states = {v: (entry.state, entry.reason) for v in listed}
            states.update((v, (UNAVAILABLE, UNLOADED_REASON)) for v in entry.unloaded_versions)
            for version in sorted(states) or [None]:
                state, reason = states.get(version, (entry.state, entry.reason))
                row = {"name": name}
                if version is not None:
                    row["version"] = str(version)
                row["state"] = state
                if reason:
                    row["reason"] = reason
                rows.append(row)
        return rows

    async def load(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Load ``name`` (reload it when loaded): parameters ``config`` (the model
        configuration as JSON, instead of config.pbtxt) and ``file:<path>`` (file contents,
        for a model that is not on disk).

        Once started, a load runs to its end even if the caller goes away (a half-done load
        would leave instances running that nothing serves or stops)."""
        self._require_explicit()
        await self._run_to_end(self._load(name, parameters))

    async def add(self, name: str) -> None:
        """Load ``name``, which the program serving in-process has just written into one of
        the repository paths (a callable bound while serving), whatever the control mode."""
        await self._run_to_end(self._load(name, None))

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Stop serving ``name`` once its queued and running requests are done, and the
        loaded ensembles that have a step on it (they load again once it is loaded again;
        ``name`` itself, unloaded by name, does not). With ``unload_dependents``, an
        ensemble's step models go too, unless another loaded ensemble uses them."""
        self._require_explicit()
        await self._run_to_end(self._unload_with_dependencies(name, unload_dependents))

    async def _unload_with_dependencies(
        self, name: str, unload_dependents: bool, *, step_gone: bool = False
    ) -> None:
        """Unload ``name`` and the loaded ensembles with a step on it (``step_gone``: ``name``
        is one of those, which then waits for its steps to come back)."""
        entry = self.repository.entry(name)
        steps = plan_models(entry.config) if entry is not None and entry.config else set()
        # An ensemble loaded from uploaded files is not waited for: its files go with it.
        if step_gone and name not in self._temp_dirs:
            self._waiting[name] = steps
        else:
            self._waiting.pop(name, None)
            self._config_parameters.pop(name, None)
        await self._unload(name)
        for ensemble in self.repository.dependents(name):
            await self._unload_with_dependencies(ensemble, False, step_gone=True)
        if unload_dependents:
            for model in sorted(steps):
                if not self.repository.dependents(model):
                    await self._unload_with_dependencies(model, True)

    async def drain(self) -> None:
        """Wait for loads and unloads in progress (before the server stops its models)."""
        while self._operations:
            await asyncio.gather(*self._operations, return_exceptions=True)

    async def _run_to_end(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._operations.add(task)
        task.add_done_callback(self._operations.discard)
        await asyncio.shield(task)

    async def _load(self, name: str, parameters: Mapping[str, Any] | None) -> None:
        self._in_load.add(name)
        try:
            await self._load_unguarded(name, parameters)
        finally:
            self._in_load.discard(name)
        self._waiting.pop(name, None)  # loaded: it waits for nothing any more
        await self._load_waiting_ensembles(name)

    async def _load_waiting_ensembles(self, loaded: str) -> None:
        """Load again the waiting ensembles with a step on ``loaded`` whose step models are all
        loaded now. As in Triton, this is part of the load of ``loaded`` (its answer comes
        once they are loaded), and an ensemble that fails to load is logged, not answered (it
        goes on waiting: a later load of one of its step models tries again)."""
        for ensemble, steps in sorted(self._waiting.items()):
            if loaded not in steps or ensemble in self._in_load or ensemble not in self._waiting:
                continue  # not this model's, being loaded already, or loaded meanwhile
            if not all(self.repository.is_ready(step) for step in steps):
                continue
            log.info("loading ensemble '%s' again: the models of its steps are loaded", ensemble)
            try:
                await self._load(ensemble, self._config_parameters.get(ensemble))
            except TritonError as error:
                log.error("%s", error.message)

    async def _load_unguarded(self, name: str, parameters: Mapping[str, Any] | None) -> None:
        _check_model_name(name)
        parameters = dict(parameters or {})
        config_text = parameters.pop("config", None)
        override = _config_override(name, config_text)
        files = {
            k[len(FILE_PREFIX) :]: v for k, v in parameters.items() if k.startswith(FILE_PREFIX)
        }
        async with self._lock(name):
            if files:
                if override is None:
                    raise _poll_failure(
                        name, "Load parameter 'config' must be specified for model file override"
                    )
                model_dir = await asyncio.to_thread(_write_model_files, name, files)
                fingerprint = ""
            else:
                found = self.repository.discover().get(name)
                if found is None:
                    raise _poll_failure(name, "model not found in any model repository.")
                model_dir = found
                await self._load_composing_models(name, found)
                fingerprint = "" if override else await asyncio.to_thread(_fingerprint, found)
                current = self.repository.entry(name)
                unchanged = fingerprint and self._loaded_from.get(name) == fingerprint
                if unchanged and current is not None and current.state == READY:
                    return  # nothing changed on disk: Triton does nothing either
            entry = await asyncio.to_thread(self.repository.prepare, name, model_dir, override)
            if entry.state != READY:
                if files:
                    shutil.rmtree(model_dir.parent, ignore_errors=True)
                current = self.repository.entry(name)
                if current is None or current.state != READY:
                    self.repository.publish(entry)  # the index reports why
                if entry.poll_failed:
                    raise _poll_failure(name, entry.reason)
                why = entry.failure or entry.reason
                raise InvalidArgumentError(f"load failed for model '{name}': {why}")
            replaced = self.repository.publish(entry)
            self._loaded_from[name] = fingerprint
            if override is not None and not files:
                self._config_parameters[name] = {"config": config_text}
            else:
                self._config_parameters.pop(name, None)
            previous_dir = self._temp_dirs.pop(name, None)
            if files:
                self._temp_dirs[name] = model_dir.parent
            if replaced is not None:
                await asyncio.to_thread(self.repository.retire, replaced, self._exit_timeout)
            if previous_dir is not None:
                shutil.rmtree(previous_dir, ignore_errors=True)

    async def _load_composing_models(self, name: str, model_dir: Path) -> None:
        """An ensemble's step models are loaded first when they are not (as Triton does); a
        failed one is left for the ensemble's own load to report."""
        for model in await asyncio.to_thread(composing_models, model_dir):
            entry = self.repository.entry(model)
            if model in self._in_load or (entry is not None and entry.state == READY):
                continue
            with contextlib.suppress(TritonError):
                await self._load(model, None)

    async def _unload(self, name: str) -> None:
        async with self._lock(name):
            entry = self.repository.begin_unload(name)
            if entry is None:
                return
            await asyncio.to_thread(self.repository.retire, entry, self._exit_timeout)
            self.repository.finish_unload(name)
            temp_dir = self._temp_dirs.pop(name, None)
            if temp_dir is not None:
                shutil.rmtree(temp_dir, ignore_errors=True)

    def remove_uploads(self) -> None:
        """At shutdown, once the models stopped: the uploaded models' temporary directories."""
        for temp_dir in self._temp_dirs.values():
            shutil.rmtree(temp_dir, ignore_errors=True)
        self._temp_dirs.clear()

    def _require_explicit(self) -> None:
        if self.mode != EXPLICIT:  # Triton's words, in "none" mode too
            raise UnavailableError(
                "explicit model load / unload is not allowed if polling is enabled"
            )

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    # -- poll mode --------------------------------------------------------------------------------
    async def poll_forever(self) -> None:
        """Apply the repository's changes every poll interval (poll mode; an interval of 0
        or less means no polling)."""
        if self._poll_secs <= 0:
            log.warning(
                "--repository-poll-secs is %s: the repository is not polled", self._poll_secs
            )
            return
        while True:
            await asyncio.sleep(self._poll_secs)
            try:
                await self.poll_once()
            except Exception:  # one bad scan must not end polling
                log.exception("polling the model repository failed")

    async def poll_once(self) -> None:
        now = await asyncio.to_thread(self._scan)
        before = self._fingerprints
        for name in sorted(set(before) - set(now)):
            log.info("model '%s' left the repository: unloading", name)
            # As in Triton, the loaded ensembles with a step on it go too, and come back once
            # it is back (see _waiting).
            await self._apply(self._unload_with_dependencies(name, False))
        for name, fingerprint in sorted(now.items()):
            if before.get(name) != fingerprint:
                log.info(
                    "model '%s' %s: loading", name, "changed" if name in before else "appeared"
                )
                await self._apply(self._load(name, None))
        self._fingerprints = now

    async def _apply(self, change: Coroutine[Any, Any, None]) -> None:
        """A load or unload the poller found needed; its failure is logged, polling goes on."""
        try:
            await self._run_to_end(change)
        except (InvalidArgumentError, InternalError) as error:
            log.error("%s", error.message)

    def _scan(self) -> dict[str, str]:
        """The fingerprint of every model directory in the repository."""
        return {name: _fingerprint(path) for name, path in self.repository.discover().items()}


def _check_model_name(name: str) -> None:
    """A model name is one directory name: nothing that could step out of a repository."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise InvalidArgumentError(f"invalid model name '{name}'")


def _fingerprint(model_dir: Path) -> str:
    """What a model directory holds: the names, sizes and modification times of its files."""
    digest = hashlib.sha256()
    for path in sorted(model_dir.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        try:
            stat = path.stat()
        except OSError:
            continue
        line = f"{path.relative_to(model_dir)}|{stat.st_size}|{stat.st_mtime_ns}\n"
        digest.update(line.encode())
    return digest.hexdigest()


def _poll_failure(name: str, detail: str) -> InternalError:
    """Triton's answer when a model cannot be found or read for loading (Triton only logs the
    detail; we also append it)."""
    log.error("failed to load '%s': %s", name, detail)
    return InternalError(f"failed to load '{name}', failed to poll from model repository: {detail}")


def _config_override(name: str, text: Any) -> model_config_pb2.ModelConfig | None:
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise InvalidArgumentError("the 'config' parameter must be a string of JSON")
    config = model_config_pb2.ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as error:
        raise _poll_failure(name, f"Invalid config override: {error}") from None
    return config


# Why writing an uploaded file can fail through the path the client chose (a part too long,
# a file where the path needs a directory, or the other way round): the client's error.
_PATH_ERRNOS = frozenset(
    {errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EINVAL}
)


def _file_error(relative: str, err: OSError | ValueError) -> TritonError:
    """What a load with an uploaded file that could not be written answers."""
    if isinstance(err, ValueError) or err.errno in _PATH_ERRNOS:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        return InvalidArgumentError(f"Invalid file path '{FILE_PREFIX}{relative}': {why}")
    return InternalError(f"failed to write the model file '{FILE_PREFIX}{relative}': {err}")


def _write_model_files(name: str, files: Mapping[str, Any]) -> Path:
    """A temporary model directory holding ``files`` (relative paths -> bytes)."""
    root = Path(tempfile.mkdtemp(prefix=leftovers.temp_dir_prefix("model")))
    model_dir = root / name
    model_dir.mkdir()
    try:
        for relative, content in files.items():
            parts = PurePosixPath(relative).parts
            if not parts or PurePosixPath(relative).is_absolute() or ".." in parts:
                raise InvalidArgumentError(
                    f"file override path '{relative}' must stay inside the model directory"
                )
            target = model_dir.joinpath(*parts)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content if isinstance(content, bytes) else str(content).encode())
            except (OSError, ValueError) as err:  # ValueError: a NUL in the path
                raise _file_error(relative, err) from None
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return model_dir

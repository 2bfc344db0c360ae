"""One in-process instance of a Python model: its own ``TritonPythonModel`` object.

Triton starts a stub process per instance and copies tensors through shared memory; here
``execute`` receives the numpy arrays the codec decoded, without a copy, on the instance's own
thread. What ``execute`` may do follows Triton's Python backend:

- return one ``InferenceResponse`` per request (the single-response case);
- return None and answer through each request's ``get_response_sender()`` instead, now or
  later from any thread: one response per request for a default model, any number followed by
  ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` for a decoupled one (which must return None);
- be ``async def``: it runs on the instance's own event loop (:mod:`.modelloop`), awaited
  for a default model, left running for a decoupled one.

A model may also define ``execute_batched({input: array}) -> {output: array}`` (a tritonfast
extension): whole-batch arrays, gathered and split by :mod:`tritonfast.runtime.batchtensor`.
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from typing import Any

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import ModelInstance, PhaseClock
from tritonfast.backends.python import pb_utils
from tritonfast.backends.python.loader import calls_server, describe
from tritonfast.backends.python.modelloop import ModelLoop
from tritonfast.config.jsonform import config_to_json
from tritonfast.data.datatypes import WIRE_DATATYPES
from tritonfast.data.types import (
    MODEL_PARAMETERS_ONLY,
    PROTOCOL_PARAMETERS,
    RELEASE_RESCHEDULE,
    InferRequest,
    InferResponse,
    OutputTensor,
    protocol_parameters,
)
from tritonfast.errors import InternalError, TritonError, error_for
from tritonfast.runtime import batchtensor
from tritonfast.runtime.responses import Result

log = logging.getLogger(__name__)

# What a model's code may raise that fails its call rather than ending its process: Triton's
# stub reports a SystemExit (``sys.exit()`` in ``execute``) as the call's error, too.
_MODEL_FAILURES = (Exception, SystemExit)


class PythonInstance(ModelInstance):
    def __init__(
        self,
        model_class: type,
        config: model_config_pb2.ModelConfig,
        *,
        instance_name: str,
        repository_path: Path,
        version: int,
        model_file: Path,
        device_id: int = 0,
    ) -> None:
        self._config = config
        self._instance_name = instance_name
        self._decoupled = config.model_transaction_policy.decoupled
        self._output_names = [o.name for o in config.output]
        # numpy has no bfloat16: a BF16 output arrives as uint16 bits and takes the config's type.
        self._bf16_outputs = {
            o.name for o in config.output if o.data_type == model_config_pb2.TYPE_BF16
        }
        self._output_types = {o.name: WIRE_DATATYPES[o.data_type] for o in config.output}
        # What a response may carry: the declared outputs (and implicit states' next values,
        # which the sequence batcher takes out); anything else is dropped, as Triton does.
        self._declared_outputs = {o.name for o in config.output} | {
            s.output_name for s in config.sequence_batching.state
        }
        self._convert = self._from_pb  # made once: every request's pb_utils wrapper holds it
        self._model = model_class()
        # A model may take whole-batch arrays instead of a list of requests (tritonfast only).
        self._batched = getattr(self._model, "execute_batched", None)
        if self._batched is not None and config.max_batch_size == 0:
            self._batched = None
        execute = self._batched or getattr(self._model, "execute", None)
        # Triton loads a model without ``execute`` and fails each of its batches with this.
        self._no_execute = (
            f"Python model {model_file} does not implement `execute` method."
            if execute is None
            else ""
        )
        self._coroutine = inspect.iscoroutinefunction(execute)
        self._model_loop = ModelLoop(instance_name) if self._coroutine else None
        # Whether it may wait on the server (BLS) or on a loop of its own; then, and for a
        # decoupled model (which waits on its streams), never on the server's event loop,
        # where such a wait could never end (see runtime.looprun).
        self.may_wait = self._coroutine or calls_server(model_class)
        self.may_run_on_event_loop = not (self.may_wait or self._decoupled)
        initialize = getattr(self._model, "initialize", None)
        if initialize is not None:
            args = {
                "model_config": json.dumps(config_to_json(config)),
                "model_instance_kind": "CPU",
                "model_instance_name": instance_name,
                "model_instance_device_id": str(device_id),
                "model_repository": str(repository_path),
                "model_version": str(version),
                "model_name": config.name,
            }
            try:
                initialize(args)
            except _MODEL_FAILURES as exc:
                # The model's own error, as Triton's stub reports it (the server names the
                # instance in its log).
                raise InternalError(describe(exc)) from exc

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        if self._no_execute:
            return [self._failed_with(self._no_execute)] * len(requests)
        if self._batched is not None:
            return self._execute_batched(self._batched, requests, clock)
        pb_requests = [self._to_pb(r) for r in requests]
        clock.inputs_ready()
        try:
            returned = self._call(self._model.execute, pb_requests, requests)
        except _MODEL_FAILURES as exc:
            return self._failed_batch(exc, requests)
        clock.infer_done()
        if self._decoupled:
            self._refuse_returned(returned, requests)
            return None
        return self._default_return(returned, requests)

    def _call(self, execute: Any, argument: Any, requests: list[InferRequest]) -> Any:
        """``execute(argument)``; a coroutine runs on the model's loop, awaited unless the
        model is decoupled (then its failure ends each request's stream with the error)."""
        returned = execute(argument)
        if not inspect.iscoroutine(returned):
            return returned
        assert self._model_loop is not None
        if not self._decoupled:
            return self._model_loop.run(returned)

        def failed(exc: BaseException) -> None:
            log.error("instance %s: async execute failed: %r", self._instance_name, exc)
            error = self._failed(exc)
            for request in requests:
                if request.sender is not None:
                    request.sender.abandon(error)

        self._model_loop.spawn(returned, failed)
        return None

    def _refuse_returned(self, returned: Any, requests: list[InferRequest]) -> None:
        """A decoupled model answers through its senders only; anything it returns ends its
        requests with Triton's error."""
        if returned is not None:
            error = self._failed_with(
                f"Python model '{self._instance_name}' is using the decoupled mode and the"
                " execute function must return None."
            )
            for request in requests:
                request.sender.abandon(error)

    def _default_return(self, returned: Any, requests: list[InferRequest]) -> list[Result] | None:
        """One response per request, or None when the model used its senders."""
        if returned is None:
            return None
        count = len(requests)
        if not isinstance(returned, list):
            error = self._failed_with(
                f"Expected a list in the execute return, found type '{type(returned).__name__}'."
            )
            return [error] * count
        if len(returned) != count:
            error = self._failed_with(
                "Number of InferenceResponse objects do not match the number of"
                f" InferenceRequest objects. InferenceRequest(s) size is:{count}, and"
                f" InferenceResponse(s) size is:{len(returned)}\n"
            )
            return [error] * count
        results: list[Result] = []
        for request, response in zip(requests, returned, strict=True):
            if response is None:  # answered through its response sender, or rescheduled
                if request.sender is not None or request.release_flags & RELEASE_RESCHEDULE:
                    results.append(None)  # type: ignore[arg-type]  # (as below)
                else:
                    results.append(self._unanswered(request))
                continue
            result = self._from_pb(request, response)
            if request.sender is not None:
                # The model also holds this request's sender: the returned response is its
                # one response, sent with the final flag (an error if it already sent one).
                try:
                    request.sender.send(result, final=True)
                except TritonError as error:
                    request.sender.abandon(error)
                result = None  # type: ignore[assignment]  # answered through the sender
            results.append(result)
        return results

    def _failed_batch(self, exc: BaseException, requests: list[InferRequest]) -> list[Result]:
        """``execute`` raised: each request gets the error, but one whose response the model
        had sent already (without the final flag) gets that response, as in Triton."""
        error = self._failed(exc)
        held = [r.sender is not None and r.sender.deliver_held() for r in requests]
        if not any(held):
            return [error] * len(requests)
        # None: answered through its sender.
        return [None if sent else error for sent in held]  # type: ignore[misc]

    def _unanswered(self, request: InferRequest) -> InternalError:
        return InternalError(
            f"model instance '{self._instance_name}' returned no response for request"
            f" '{request.id}' and did not use its response sender"
        )

    def _failed(self, exc: BaseException) -> InternalError:
        return self._failed_with(describe(exc))

    def _failed_with(self, message: str) -> InternalError:
        return InternalError(
            f"Failed to process the request(s) for model '{self._instance_name}',"
            f" message: {message}"
        )

    def _execute_batched(
        self, execute_batched: Any, requests: list[InferRequest], clock: PhaseClock
    ) -> list[Result]:
        """``execute_batched({input: whole-batch array}) -> {output: whole-batch array}``:
        each input concatenated along the batch dimension (one pooled copy), each output split
        back into one view per request."""
        inputs, sizes = batchtensor.gather_inputs(requests)
        clock.inputs_ready()
        try:
            outputs = self._call(execute_batched, inputs, requests)
        except _MODEL_FAILURES as exc:
            return [self._failed(exc)] * len(requests)
        clock.infer_done()
        try:
            return list(
                batchtensor.scatter_outputs(
                    outputs, sizes, requests, self._output_types, self._instance_name
                )
            )
        except InternalError as error:
            return [error] * len(requests)

    def finalize(self) -> None:
        try:
            finalize = getattr(self._model, "finalize", None)
            if finalize is not None:
                finalize()
        except _MODEL_FAILURES as exc:
            raise InternalError(describe(exc)) from exc
        finally:
            if self._model_loop is not None:
                self._model_loop.stop()

    def _to_pb(self, request: InferRequest) -> pb_utils.InferenceRequest:
        wanted = (
            [o.name for o in request.outputs] if request.outputs is not None else self._output_names
        )
        params = request.parameters
        protocol = protocol_parameters(params)
        if protocol is not params:  # all the model's (a generate request's)
            params = {k: v for k, v in params.items() if k != MODEL_PARAMETERS_ONLY}
        elif not PROTOCOL_PARAMETERS.isdisjoint(params):
            params = {k: v for k, v in params.items() if k not in PROTOCOL_PARAMETERS}
        pb_request = pb_utils.InferenceRequest._of(
            request.model_name,
            wanted,
            [pb_utils.Tensor._wrap(t.name, t.data, t.datatype) for t in request.inputs],
            request.id,
            protocol.get("sequence_id", 0),
            params,
        )
        pb_request._origin = request
        pb_request._convert = self._convert
        return pb_request

    def _from_pb(self, request: InferRequest, response: Any) -> Result:
        """A model's ``InferenceResponse`` for ``request`` as the server's response."""
        if not isinstance(response, pb_utils.InferenceResponse):
            return self._failed_with(
                "Expected an 'InferenceResponse' object in the execute function return list,"
                f" found type '{type(response).__name__}'."
            )
        # (The fields themselves, not their getters: this runs for every response.)
        error = response._error
        if error is not None:
            code = pb_utils.ERROR_CODES.get(
                error.code(), pb_utils.ERROR_CODES[pb_utils.TritonError.INTERNAL]
            )
            return error_for(code, error.message())
        declared = self._declared_outputs
        if request.outputs is not None:
            declared = declared & {o.name for o in request.outputs}
        outputs = []
        for tensor in response._output_tensors:
            name = tensor._name
            if name not in declared:
                continue
            array = tensor._array
            datatype = tensor._wire_dtype
            if datatype == "UINT16" and name in self._bf16_outputs:
                datatype = "BF16"
            outputs.append(OutputTensor(name, datatype, array.shape, array))
        return InferResponse(
            model_name=request.model_name,
            model_version=str(request.model_version),
            id=request.id,
            outputs=outputs,
            parameters=response.parameter_dict,
        )

"""Python callables served as models, in the server's own process: the model description
(:mod:`.spec`), the requests a callable receives (:mod:`.request`), the decorators that shape
them (:mod:`.decorators`), the backend that runs them (:mod:`.backend`) and the in-process
server they are bound to (:mod:`tritonfast.inprocess`). See docs/callables.md."""

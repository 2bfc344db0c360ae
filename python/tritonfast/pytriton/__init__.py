"""PyTriton's public API over tritonfast: a PyTriton program runs with its imports rewritten
from ``pytriton.`` to ``tritonfast.pytriton.`` and nothing else changed. Its callables run in
this process, inside tritonfast's own server, with no separate Triton process and no proxy
between them (docs/pytriton.md says what else differs)."""

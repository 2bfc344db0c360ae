"""Backends used only by tritonfast's tests, registered through the ``tritonfast.backends``
entry-point group (the ``.dist-info`` beside this package declares them): a server started
with this directory on ``PYTHONPATH`` serves models that name them."""

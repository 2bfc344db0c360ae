"""tritonfast: a Triton-compatible inference server with a Rust core."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tritonfast")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+local"

__all__ = ["__version__"]

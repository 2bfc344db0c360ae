"""``python -m tritonfast serve …`` (and ``perf …``, ``selfcheck tensorrt``), and the
``tritonfast`` console script."""

from __future__ import annotations

import sys

from tritonfast.cli import build_parser, parse_serve_args, subcommand
from tritonfast.server import run


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["perf"]:
        from tritonfast.perf import main as perf

        return perf(args[1:])
    if args[:1] == ["selfcheck"]:
        backend = subcommand(build_parser(), "selfcheck").parse_args(args[1:]).backend
        return selfcheck(backend)
    options = parse_serve_args(args)
    return run(options)


def selfcheck(backend: str) -> int:
    """``selfcheck tensorrt``: see tritonfast.backends.tensorrt.selfcheck."""
    from tritonfast.backends.tensorrt import selfcheck as tensorrt_check

    assert backend == "tensorrt"  # the parser allows no other
    return tensorrt_check.run()


if __name__ == "__main__":
    sys.exit(main())

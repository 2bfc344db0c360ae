"""``python -m tritonfast serve …`` (and ``selfcheck tensorrt``), and the ``tritonfast``
console script."""

from __future__ import annotations

import sys

from tritonfast.cli import parse_serve_args
from tritonfast.server import run

SELFCHECKS = ("tensorrt",)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["selfcheck"]:
        return selfcheck(args[1:])
    options = parse_serve_args(args)
    return run(options)


def selfcheck(args: list[str]) -> int:
    """``selfcheck tensorrt``: see tritonfast.backends.tensorrt.selfcheck."""
    if args != ["tensorrt"]:
        print(f"usage: python -m tritonfast selfcheck {{{','.join(SELFCHECKS)}}}", file=sys.stderr)
        return 2
    from tritonfast.backends.tensorrt import selfcheck as tensorrt_check

    return tensorrt_check.run()


if __name__ == "__main__":
    sys.exit(main())

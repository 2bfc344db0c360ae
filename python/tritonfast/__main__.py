"""``python -m tritonfast serve …`` and the ``tritonfast`` console script."""

from __future__ import annotations

import sys

from tritonfast.cli import parse_serve_args
from tritonfast.server import run


def main(argv: list[str] | None = None) -> int:
    options = parse_serve_args(sys.argv[1:] if argv is None else argv)
    return run(options)


if __name__ == "__main__":
    sys.exit(main())

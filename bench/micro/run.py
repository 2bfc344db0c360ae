"""Run every microbenchmark in bench/micro (``*_bench.py``) and print its figures.

``--quick`` keeps the whole run to seconds; CI runs it so the figures are recorded with
every build. Nothing here passes or fails on a number.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs (CI)")
    args = parser.parse_args()
    failures = 0
    for script in sorted(HERE.glob("*_bench.py")):
        print(f"== {script.name}", flush=True)
        cmd = [sys.executable, str(script)] + (["--quick"] if args.quick else [])
        result = subprocess.run(cmd, check=False)
        if result.returncode != 0:
            print(f"!! {script.name} exited with {result.returncode}", flush=True)
            failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

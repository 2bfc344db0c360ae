#!/usr/bin/env bash
# The test suite on every CPython 3.10-3.13 found here (python3.X on PATH, or a pyenv
# version), each in an environment of its own (.venv-3.X) holding the built wheel (make wheel)
# with its test extras. Prints one line per version; exits non-zero if any failed.
#
#   usage: scripts/test_matrix.sh [VERSION...]      (3.10 3.11 3.12 3.13)
#   PYTEST_ARGS  more arguments for pytest
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(3.10 3.11 3.12 3.13)
read -r -a EXTRA <<< "${PYTEST_ARGS:-}"

interpreter() {  # a python3.X that runs, or nothing
  local version=$1 candidate
  for candidate in "$(command -v "python$version")" \
      $(command -v pyenv >/dev/null && pyenv versions --bare 2>/dev/null \
        | grep -E "^${version//./\\.}\.[0-9]+$" | while read -r v; do
            echo "$(pyenv prefix "$v")/bin/python$version"; done); do
    [ -n "$candidate" ] && "$candidate" -c 'import venv' 2>/dev/null && { echo "$candidate"; return; }
  done
}

wheel=$(ls dist/tritonfast-*-abi3-*.whl 2>/dev/null | tail -1)
[ -n "$wheel" ] || { echo "no wheel in dist/: run make wheel first" >&2; exit 2; }
status=0
summary=()
for version in "${VERSIONS[@]}"; do
  python=$(interpreter "$version")
  if [ -z "$python" ]; then
    summary+=("$version: no such Python here, skipped")
    continue
  fi
  env=".venv-$version"
  [ -x "$env/bin/python" ] || "$python" -m venv "$env"
  "$env/bin/python" -m pip install -q --upgrade pip
  "$env/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
  "$env/bin/python" -m pip install -q "$wheel[test]"
  # The tests import the checkout's tests/ package and the installed tritonfast.
  if "$env/bin/python" -m pytest -q -p no:cacheprovider "${EXTRA[@]}" tests > "$env/pytest.log" 2>&1; then
    summary+=("$version: $(tail -1 "$env/pytest.log")")
  else
    status=1
    summary+=("$version: FAILED, $(tail -1 "$env/pytest.log") (log: $env/pytest.log)")
  fi
done
printf '%s\n' "${summary[@]}"
exit $status

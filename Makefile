# The one interface that people and CI both call.
#   make install   create .venv and install tritonfast with its test extras (builds the Rust core)
#   make test      cargo test + pytest + the quick microbenchmarks (figures printed, not judged)
#   make wheel     the manylinux abi3 wheel (CPython 3.10 and later) and the sdist, into dist/
#   make test-matrix  the test suite on each CPython 3.10-3.13 found here, from the wheel
#   make ci        install, then check generated protos, lint (stubtest included), build the wheel
#                  and test (the wheel's install test included): what .ci/run runs
VENV    ?= .venv
PYTHON  ?= $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: venv install build wheel test-matrix test test-rust test-python bench-quick bench lint lint-fast stubtest fmt protos protos-check ci serve

venv:
	@test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip

install: venv
	$(PYTHON) -m pip install -q '.[test]' 'ruff>=0.6' 'mypy>=1.10'
	# The proto generator is pinned (its protoc decides the generated code); it declares
	# protobuf<6, which tritonclient's protobuf 6 satisfies in practice, hence --no-deps.
	$(PYTHON) -m pip install -q --no-deps grpcio-tools==1.71.2
	# Dynamo's frontend, for tests/e2e/test_dynamo.py: one of ai-dynamo's dependencies is a
	# placeholder package, so it goes in without them (what it imports is in the test extra).
	$(PYTHON) -m pip install -q --no-deps ai-dynamo==1.6.1

build: venv
	$(PYTHON) -m pip install -q --no-deps --force-reinstall .

# One wheel for every CPython from 3.10 (abi3), linked by zig against glibc 2.17 so that it
# carries a manylinux2014 tag and installs on any Linux of the last decade; no Rust needed
# where it is installed. tests/e2e/test_wheel.py installs it into a fresh environment.
wheel: venv
	$(PYTHON) -m pip install -q 'maturin>=1.5,<2' 'ziglang>=0.13'
	rm -rf dist
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/maturin build --release --zig \
		--compatibility manylinux2014 --out dist
	$(VENV)/bin/maturin sdist --out dist

test-matrix: wheel
	scripts/test_matrix.sh

test-rust:
	cargo test --quiet

test-python:
	$(PYTHON) -m pytest $(PYTEST_ARGS)

bench-quick:
	$(PYTHON) bench/micro/run.py --quick

test: test-rust test-python bench-quick

bench:
	cargo bench --bench queue
	$(PYTHON) bench/micro/run.py

# The checks that need no compile: part of every CI run. stubtest checks the installed
# extension against python/tritonfast/_core.pyi, so after Rust changes it needs `make build`
# first; `make ci` installs before it lints.
lint-fast: stubtest
	$(PYTHON) -m ruff check python tests bench scripts
	$(PYTHON) -m ruff format --check python tests bench scripts
	$(PYTHON) -m mypy python/tritonfast
	cargo fmt --check

# The runtime side is the installed extension; MYPYPATH makes the stub side this checkout's
# _core.pyi rather than the installed copy.
stubtest:
	MYPYPATH=python $(PYTHON) -m mypy.stubtest tritonfast._core

lint: lint-fast
	cargo clippy --all-targets -- -D warnings
	cargo clippy --all-targets --features python -- -D warnings

fmt:
	$(PYTHON) -m ruff format python tests bench scripts
	cargo fmt

protos:
	$(PYTHON) scripts/gen_protos.py

protos-check:
	$(PYTHON) scripts/gen_protos.py --check

ci: install protos-check lint-fast wheel test

serve: install
	$(PYTHON) -m tritonfast serve

# The two commands a new user runs: `make demo` and `make test`. Only python3 and make are needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: demo test test-slow check bench docs results proto clean wheel pythons board-arm64 image image-check

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[plot]'
	touch $@

$(TEST_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[test]'
	touch $@

$(DOCS_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[docs]'
	touch $@

demo: $(STAMP)
	$(BIN)/splitrt demo

# The suite in two halves that together run every test once (docs/testing.md): `make test` the fast loop,
# `make test-slow` what it leaves out: `slow` (real models, killed servers, wheels) on xdist workers, then
# `root` (namespaces, tc, cgroups: the host's) and `serial` (they time themselves) in one process, alone
# (pytest's 5 is "no such test"). A module's tests run on one worker (--dist loadscope), so its
# module-scoped fixtures start once. WORKERS=0 runs in this process (e.g. for --pdb).
WORKERS ?= auto
PYTEST_XDIST = -n $(WORKERS) --dist loadscope
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_XDIST) -m "not slow and not root and not serial" tests

test-slow: $(TEST_STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_XDIST) -m "slow and not root and not serial" --durations=25 tests
	$(BIN)/python -m pytest -q -m "root or serial" --durations=10 tests || [ $$? -eq 5 ]

check: $(TEST_STAMP)
	$(BIN)/ruff check splitrt tests bench attacks
	$(BIN)/ruff format --check splitrt tests bench attacks
	$(BIN)/mypy splitrt attacks

bench: $(TEST_STAMP)
	$(BIN)/python bench/run_all.py

# The guides (docs/, mkdocs.yml) into site/; --strict: a broken link or anchor is an error.
docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --quiet

# docs/results/: the cheap benchmarks run with --json and rendered to markdown (date, commit, load average).
results: $(TEST_STAMP)
	$(BIN)/python bench/render_results.py

# Regenerate the gRPC stubs from proto/splitrt.proto (tests check they are up to date).
proto: $(TEST_STAMP)
	$(BIN)/python -m splitrt.transport.protogen

# The wheel (carries devices/*.toml, profiles/*.json and the traces) and the sdist, into dist/.
wheel: $(TEST_STAMP)
	rm -rf dist && $(BIN)/python -m build --outdir dist .

# The installed wheel's commands under every supported Python found (3.10-3.13; absent ones skip with the
# reason). `make test` runs them under this interpreter and 3.10 only.
pythons: $(TEST_STAMP)
	SPLITRT_PYTHONS=all $(BIN)/python -m pytest -v -rs tests/test_wheel.py

# The board install on arm64 under qemu user-mode emulation (root; Debian's debootstrap and
# qemu-user-static): devices/install.sh --device rpi5, the daemon's answer against x86, splitrt profile.
board-arm64: $(TEST_STAMP)
	bash devices/board-arm64.sh

# The server's container image (deploy/container/Containerfile) with buildah or podman, and a run of it.
IMAGE ?= splitrt:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# IMAGE_ARGS=--debian-base where no image registry is reachable (the base made from Debian packages).
IMAGE_ARGS ?=
image: $(TEST_STAMP)
	bash deploy/container/build.sh --tag $(IMAGE) $(IMAGE_ARGS)

image-check: $(TEST_STAMP)
	bash deploy/container/build.sh --tag $(IMAGE) $(IMAGE_ARGS) --check

clean:
	rm -rf $(VENV) site .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info deploy/container/dist

# The two commands a new user runs: `make demo` and `make test`. Only python3 and make are needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test check bench proto clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[plot]'
	touch $@

$(TEST_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[test]'
	touch $@

demo: $(STAMP)
	$(BIN)/splitrt demo

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q tests

check: $(TEST_STAMP)
	$(BIN)/ruff check splitrt tests bench
	$(BIN)/mypy splitrt

bench: $(TEST_STAMP)
	$(BIN)/python bench/run_all.py

# Regenerate the gRPC stubs from proto/splitrt.proto (tests check they are up to date).
proto: $(TEST_STAMP)
	$(BIN)/python -m splitrt.transport.protogen

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info

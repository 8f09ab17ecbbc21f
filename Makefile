# Two commands for a fresh machine (Python 3.11, make):
#   make run    set up .venv and run `twistd -n eventbus` (127.0.0.1:5556-5558, log in ./eventbus-data)
#   make test   set up .venv with test and Spark extras and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
ARGS ?=

.PHONY: run test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.run-deps: setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.test-deps: setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test,lint,spark]"
	touch $@ $(VENV)/.run-deps

run: $(VENV)/.run-deps
	$(BIN)/twistd -n eventbus $(ARGS)

test: $(VENV)/.test-deps
	$(BIN)/python -m pytest -q -n auto --dist loadfile

lint: $(VENV)/.test-deps
	$(BIN)/ruff check bus tests bench
	$(BIN)/ruff format --check bus
	$(BIN)/mypy bus

bench: $(VENV)/.run-deps
	@echo "see bench/README.md"

clean:
	rm -rf $(VENV) build *.egg-info

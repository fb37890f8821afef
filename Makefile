# agentrl: `make demo` and `make test` work on a fresh machine with Python 3.10+.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ENVS   := AgentRL/SQL-v0 AgentRL/Python-v0 AgentRL/SMTP-v0 AgentRL/SQLPythonSMTP-v0
EPISODES ?= 20

.PHONY: setup demo test test-fast lint format bench soak clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,train,examples]"
	touch $(STAMP)

demo: $(STAMP)
	@$(BIN)/agentrl-envs list
	@for id in $(ENVS); do \
	  for agent in oracle random; do \
	    $(BIN)/agentrl-envs eval $$id --agent $$agent --episodes $(EPISODES) --no-progress || exit 1; \
	  done; \
	done

test: lint
	$(BIN)/python -m pytest -q -ra

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy agentrl_envs simulators

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_env.py
	$(BIN)/python benchmarks/bench_backends.py
	$(BIN)/python benchmarks/bench_storage.py
	$(BIN)/python benchmarks/bench_sandbox.py

soak: $(STAMP)
	$(BIN)/python benchmarks/soak_sandbox.py --n 10000

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache

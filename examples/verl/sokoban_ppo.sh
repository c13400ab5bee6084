#!/usr/bin/env bash
# The run of sokoban_grpo.sh with PPO: GAE (gamma = lambda = 1) and a critic from the same
# model at the paper's critic learning rate (1e-5). For a GPU machine; ActFocus-PPO:
# `bash examples/verl/sokoban_actfocus.sh ppo`.
set -euo pipefail
bash "$(dirname "$0")/sokoban_grpo.sh" \
  algorithm.adv_estimator=gae \
  algorithm.gamma=1.0 \
  algorithm.lam=1.0 \
  critic.model.path=Qwen/Qwen2.5-0.5B-Instruct \
  critic.optim.lr=1e-5 \
  critic.ppo_micro_batch_size_per_gpu=8 \
  "$@"

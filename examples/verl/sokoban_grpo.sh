#!/usr/bin/env bash
# Qwen2.5-0.5B-Instruct on Sokoban with verl's GRPO, the episodes played by tokenergy's text
# env through the tokenergy_text_env agent loop; the ActFocus paper's settings where verl has
# them (8 env seeds x 16 rollouts = 128 trajectories, minibatches of 32 trajectories, clip
# 0.2 / 0.28, no KL loss, 200 steps, token-mean loss). For a GPU machine: not run on CPU (its
# configuration is checked by verl's own validation in tests/test_verl.py). ActFocus:
# `bash examples/verl/sokoban_actfocus.sh grpo`; PPO: examples/verl/sokoban_ppo.sh.
#
#   make verl && .venv-verl/bin/pip install vllm        # the rollout server, on the GPU machine
#   .venv-verl/bin/python examples/verl/make_data.py --out data/sokoban
#   bash examples/verl/sokoban_grpo.sh
set -euo pipefail
.venv-verl/bin/python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files=data/sokoban/train.parquet \
  data.val_files=data/sokoban/test.parquet \
  data.train_batch_size=8 \
  data.max_prompt_length=512 \
  data.max_response_length=1536 \
  actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=2 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.clip_ratio_low=0.2 \
  actor_rollout_ref.actor.clip_ratio_high=0.28 \
  actor_rollout_ref.actor.use_kl_loss=false \
  actor_rollout_ref.actor.entropy_coeff=0.001 \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.n=16 \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.agent.default_agent_loop=tokenergy_text_env \
  trainer.total_training_steps=200 \
  trainer.test_freq=10 \
  trainer.n_gpus_per_node=4 \
  trainer.nnodes=1 \
  trainer.logger=console \
  "$@"

#!/usr/bin/env bash
# The run of sokoban_grpo.sh (or sokoban_ppo.sh) with the paper's ActFocus (alpha 0.1, beta
# 0.5): the trainer `actfocus` of tokenergy.integrations.verl scales verl's advantages by the
# paper's weights (roles from the <think>/<answer> spans, energy the reference's free energy
# -logsumexp of its logits, from its forward pass), normalised by their sum. The reference runs
# because the KL loss is on with a coefficient of 0 (the paper trains without a KL term).
# For a GPU machine.
#
#   bash examples/verl/sokoban_actfocus.sh grpo      # or: ppo
set -euo pipefail
ALGO=${1:-grpo}
shift || true
bash "$(dirname "$0")/sokoban_${ALGO}.sh" \
  trainer.v1.trainer_mode=actfocus \
  actor_rollout_ref.actor.use_kl_loss=true \
  actor_rollout_ref.actor.kl_loss_coef=0 \
  +algorithm.actfocus.alpha=0.1 \
  +algorithm.actfocus.beta=0.5 \
  "$@"

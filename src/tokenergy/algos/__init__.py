"""Training loops. ``ppo`` trains the MLP actor-critic on vector-observation envs; ``lm`` trains
language-model agents in text environments (SFT, then PPO, GRPO or REINFORCE over tokens)."""

from tokenergy.algos.ppo import TrainResult, train_ppo

__all__ = ["TrainResult", "train_ppo"]

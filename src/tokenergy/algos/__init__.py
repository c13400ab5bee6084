"""Training loops. ``ppo`` trains the MLP actor-critic on vector-observation envs."""

from tokenergy.algos.ppo import TrainResult, train_ppo

__all__ = ["TrainResult", "train_ppo"]

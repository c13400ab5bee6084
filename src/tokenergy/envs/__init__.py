"""Environments. Importing this package registers the ``tokenergy/*`` Gymnasium ids."""

from __future__ import annotations

import gymnasium as gym

from tokenergy.envs.bottleneck import BottleneckGridEnv
from tokenergy.envs.vector import BatchedEnv, EpisodeStats, StepResult

__all__ = ["BatchedEnv", "BottleneckGridEnv", "EpisodeStats", "StepResult"]

if "tokenergy/BottleneckGrid-v0" not in gym.registry:
    gym.register(
        id="tokenergy/BottleneckGrid-v0",
        entry_point="tokenergy.envs.bottleneck:BottleneckGridEnv",
        max_episode_steps=100,
        reward_threshold=0.8,
    )

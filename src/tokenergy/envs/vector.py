"""A small synchronous batch of Gymnasium envs with explicit autoreset.

Kept deliberately simple (no sub-processes, no autoreset modes): after a step that ends an
episode the env is reset at once, the returned observation is the new episode's first one,
and the true last observation is kept in ``final_obs`` so truncated steps can bootstrap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

__all__ = ["BatchedEnv", "EpisodeStats", "StepResult"]


@dataclass
class EpisodeStats:
    """One finished episode."""

    env_index: int
    ret: float
    length: int
    success: bool | None  # None when the env does not report success


@dataclass
class StepResult:
    """The outcome of one batched step (B = number of envs)."""

    obs: np.ndarray  # (B, *obs_shape) observation to act on next (after autoreset)
    rewards: np.ndarray  # (B,) float32
    terminated: np.ndarray  # (B,) bool
    truncated: np.ndarray  # (B,) bool
    final_obs: np.ndarray  # (B, *obs_shape) true successor of this step (== obs where not done)
    episodes: list[EpisodeStats] = field(default_factory=list)


class BatchedEnv:
    """``B`` copies of an env, stepped in lockstep; env ``i`` is seeded with ``seed + i``."""

    def __init__(self, env_fns: list[Callable[[], gym.Env]]) -> None:
        if not env_fns:
            raise ValueError("BatchedEnv needs at least one env")
        self.envs = [fn() for fn in env_fns]
        first = self.envs[0]
        if not isinstance(first.action_space, gym.spaces.Discrete):
            raise ValueError(
                f"PPO here needs a discrete action space, got {first.action_space} "
                f"for {getattr(first.spec, 'id', type(first).__name__)}"
            )
        if not isinstance(first.observation_space, gym.spaces.Box):
            raise ValueError(
                f"PPO here needs a Box observation space, got {first.observation_space}"
            )
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.num_envs = len(self.envs)
        self._returns = np.zeros(self.num_envs, dtype=np.float64)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)

    @classmethod
    def make(cls, env_id: str, num_envs: int, **kwargs) -> BatchedEnv:
        """``num_envs`` copies of ``gymnasium.make(env_id, **kwargs)``."""
        import tokenergy.envs.bottleneck  # noqa: F401  (registers the tokenergy/* ids)

        return cls([lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)])

    def reset(self, seed: int) -> np.ndarray:
        obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]
        for i, env in enumerate(self.envs):
            env.action_space.seed(seed + i)
        self._returns[:] = 0.0
        self._lengths[:] = 0
        return np.stack(obs).astype(np.float32)

    def step(self, actions: np.ndarray) -> StepResult:
        obs, final_obs = [], []
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        episodes: list[EpisodeStats] = []
        for i, env in enumerate(self.envs):
            o, r, term, trunc, info = env.step(int(actions[i]))
            rewards[i], terminated[i], truncated[i] = r, term, trunc
            self._returns[i] += r
            self._lengths[i] += 1
            final_obs.append(o)
            if term or trunc:
                success = info.get("success")
                episodes.append(
                    EpisodeStats(
                        i,
                        float(self._returns[i]),
                        int(self._lengths[i]),
                        None if success is None else bool(success),
                    )
                )
                self._returns[i] = 0.0
                self._lengths[i] = 0
                o, _ = env.reset()
            obs.append(o)
        return StepResult(
            obs=np.stack(obs).astype(np.float32),
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            final_obs=np.stack(final_obs).astype(np.float32),
            episodes=episodes,
        )

    def close(self) -> None:
        for env in self.envs:
            env.close()

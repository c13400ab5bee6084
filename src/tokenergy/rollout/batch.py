"""An episode as the trainer sees it (its tokens, roles, loss mask, rewards) and a padded
batch of episodes (:class:`Trajectories`, :func:`collate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenergy.types import Role


@dataclass
class Episode:
    """One finished episode as token ids with roles and per-token rewards (no tensors yet)."""

    tokens: list[int] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    turn_texts: list[str] = field(default_factory=list)
    episode_return: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    turns: int = 0
    invalid_turns: int = 0
    seed: int = 0
    group: int = 0
    solver_moves: int = -1  # turns whose first move was the scripted solver's; -1: not counted
    state_turns: int = 0  # turns whose stated state was scored (perception)
    state_exact: int = 0  # of those, turns that stated the true state word for word
    state_tokens: float = 0.0  # summed share of state words right, position by position

    def extend(self, ids: Sequence[int], roles: Sequence[int]) -> None:
        self.tokens.extend(ids)
        self.roles.extend(roles)
        self.rewards.extend([0.0] * len(ids))


@dataclass
class Trajectories:
    """A right-padded batch of episodes. Position 0 is ``<bos>`` and is never trained.

    Fields are ``[B, T]`` unless noted.
    """

    tokens: torch.Tensor  # (B, T) int64
    roles: torch.Tensor  # (B, T) int64 Role values; padding is OBSERVATION
    attention_mask: torch.Tensor  # (B, T) bool: real tokens
    mask: torch.Tensor  # (B, T) bool: tokens the agent wrote (trained)
    rewards: torch.Tensor  # (B, T) float: each turn's reward on its last token
    terminated: torch.Tensor  # (B,) bool
    truncated: torch.Tensor  # (B,) bool
    last_index: torch.Tensor  # (B,) int64 index of the last real token
    episode_return: torch.Tensor  # (B,) float
    success: torch.Tensor  # (B,) bool
    turns: torch.Tensor  # (B,) int64
    invalid_turns: torch.Tensor  # (B,) int64
    groups: torch.Tensor  # (B,) int64: episodes from the same env seed share a group
    episodes: list[Episode]

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def to(self, device: torch.device | str) -> Trajectories:
        out = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            out[name] = v.to(device) if isinstance(v, torch.Tensor) else v
        return Trajectories(**out)

    def select(self, idx: torch.Tensor) -> Trajectories:
        """The sub-batch of rows ``idx`` (``[b]`` int64)."""
        out = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            if isinstance(v, torch.Tensor):
                out[name] = v[idx.to(v.device)]
            else:
                out[name] = [v[i] for i in idx.tolist()]
        return Trajectories(**out)


def collate(episodes: list[Episode], pad_id: int) -> Trajectories:
    """Right-pad a list of episodes into a :class:`Trajectories` batch."""
    B = len(episodes)
    T = max(len(e.tokens) for e in episodes)
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    roles = torch.full((B, T), int(Role.OBSERVATION), dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.bool)
    rewards = torch.zeros(B, T)
    for i, e in enumerate(episodes):
        n = len(e.tokens)
        tokens[i, :n] = torch.tensor(e.tokens)
        roles[i, :n] = torch.tensor(e.roles)
        attn[i, :n] = True
        rewards[i, :n] = torch.tensor(e.rewards)
    mask = attn & (roles != int(Role.OBSERVATION))
    mask[:, 0] = False

    def col(f: Callable[[Episode], Any], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([f(e) for e in episodes], dtype=dtype)

    return Trajectories(
        tokens=tokens,
        roles=roles,
        attention_mask=attn,
        mask=mask,
        rewards=rewards,
        terminated=col(lambda e: e.terminated, torch.bool),
        truncated=col(lambda e: e.truncated, torch.bool),
        last_index=col(lambda e: len(e.tokens) - 1, torch.long),
        episode_return=col(lambda e: e.episode_return, torch.float32),
        success=col(lambda e: e.success, torch.bool),
        turns=col(lambda e: e.turns, torch.long),
        invalid_turns=col(lambda e: e.invalid_turns, torch.long),
        groups=col(lambda e: e.group, torch.long),
        episodes=episodes,
    )

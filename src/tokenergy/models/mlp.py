"""MLP actor-critic for vector observations (CleanRL's PPO network, kept readable)."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["ActorCritic"]


def _layer(n_in: int, n_out: int, std: float) -> nn.Linear:
    # Orthogonal init with per-layer gain, as in the PPO implementation details
    # (Huang et al., 2022): sqrt(2) for hidden layers, 0.01 for the policy head, 1 for the value.
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(
    n_in: int, hidden: tuple[int, ...], n_out: int, out_std: float, act: type[nn.Module]
) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [_layer(n_in, h, math.sqrt(2.0)), act()]
        n_in = h
    layers.append(_layer(n_in, n_out, out_std))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs over a flat observation.

    Args:
        obs_dim: flat observation size.
        num_actions: ``A``, size of the discrete action space.
        hidden_sizes: widths of the hidden layers (both networks).
        activation: ``"tanh"`` or ``"relu"``.
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden_sizes: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
        self.actor = _mlp(obs_dim, tuple(hidden_sizes), num_actions, 0.01, act)
        self.critic = _mlp(obs_dim, tuple(hidden_sizes), 1, 1.0, act)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``obs [..., obs_dim] -> (logits [..., A], values [...])``."""
        return self.actor(obs), self.critic(obs).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs [..., obs_dim] -> values [...]``."""
        return self.critic(obs).squeeze(-1)

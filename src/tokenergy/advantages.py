"""Advantage estimators as pure tensor functions (computed without gradient: they are targets)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from tokenergy.distributed import Parallel

# masked_mean and whiten are re-exported so the math of this stage reads from one module.
from tokenergy.ops import masked_mean, whiten
from tokenergy.registry import Registry

__all__ = [
    "ALGORITHMS",
    "AdvantageResult",
    "gae",
    "group_relative",
    "high_variance_groups",
    "masked_mean",
    "token_gae",
    "whiten",
]


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    ends: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016, arXiv:1506.02438).

    ``delta_t = r_t + gamma * next_values_t * (1 - terminated_t) - values_t`` and
    ``A_t = delta_t + gamma * lam * (1 - ends_t) * A_{t+1}``, with ``A`` zero past the last
    step. ``terminated`` cuts the bootstrap (the episode really ended); ``ends`` cuts the
    recursion wherever an episode or sequence stops (terminated, truncated, or the last real
    token), so a truncated step still bootstraps through ``next_values``.

    Args:
        rewards: ``[B, T]`` ``r_t``.
        values: ``[B, T]`` ``V(s_t)``.
        next_values: ``[B, T]`` ``V(s_{t+1})``, the true successor even where the env was
            reset after step ``t`` (the final observation of a truncated episode).
        terminated: ``[B, T]`` bool.
        ends: ``[B, T]`` bool.
        gamma: discount ``γ``.
        lam: GAE ``λ``; ``λ = 1`` gives Monte-Carlo returns minus values, ``λ = 0`` one-step TD.

    Returns:
        ``(advantages, returns)``, both ``[B, T]``, ``returns = advantages + values``.
    """
    if not (rewards.shape == values.shape == next_values.shape == terminated.shape == ends.shape):
        raise ValueError(
            "gae: rewards, values, next_values, terminated, ends must share one [B, T] shape, got "
            f"{[tuple(t.shape) for t in (rewards, values, next_values, terminated, ends)]}"
        )
    not_terminated = 1.0 - terminated.to(rewards.dtype)
    not_end = 1.0 - ends.to(rewards.dtype)
    deltas = rewards + gamma * next_values * not_terminated - values  # (B, T)
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])  # (B,) A_{t+1}
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = deltas[:, t] + gamma * lam * not_end[:, t] * running
        advantages[:, t] = running
    return advantages, advantages + values


@torch.no_grad()
def group_relative(
    rewards: torch.Tensor,
    groups: torch.Tensor,
    scale: Literal["group", "batch", "none"] = "group",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages (GRPO, Shao et al., 2024, arXiv:2402.03300).

    ``A_i = r_i - mean_{g(i)}`` divided by ``std_{g(i)} + eps`` (``scale="group"``), by the
    batch std ``+ eps`` (``"batch"``, as in Dr. GRPO-style variants) or not at all
    (``"none"``). Standard deviations are unbiased; a group of one gets ``A = 0``.

    Args:
        rewards: ``[N]`` one scalar reward per completion.
        groups: ``[N]`` int64 group id (completions of the same prompt share an id).
        scale: how to scale the centred reward.
        eps: added to the std.

    Returns:
        ``[N]`` advantages.
    """
    if rewards.ndim != 1 or groups.shape != rewards.shape:
        raise ValueError(
            f"group_relative: rewards and groups must both be [N], got {tuple(rewards.shape)} "
            f"and {tuple(groups.shape)}"
        )
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"group_relative: scale must be 'group', 'batch' or 'none', got {scale!r}")
    _, inverse = torch.unique(groups, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    counts = torch.bincount(inverse, minlength=n_groups).to(rewards.dtype)
    sums = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards)
    means = sums / counts
    centred = rewards - means[inverse]
    if scale == "group":
        sq = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, centred**2)
        std = torch.sqrt(sq / (counts - 1.0).clamp(min=1.0))
        advantages = centred / (std[inverse] + eps)
    elif scale == "batch":
        batch_std = rewards.std(unbiased=True) if rewards.numel() > 1 else rewards.new_zeros(())
        advantages = centred / (batch_std + eps)
    else:
        advantages = centred
    return torch.where(counts[inverse] > 1, advantages, torch.zeros_like(advantages))


@torch.no_grad()
def high_variance_groups(returns: torch.Tensor, groups: torch.Tensor, keep: float) -> torch.Tensor:
    """StarPO-S's reward-variance filter (RAGEN, Wang et al., 2025, arXiv:2504.20073): the
    episodes of the ``ceil(keep * n_groups)`` groups whose returns have the largest standard
    deviation. A group whose episodes all scored alike teaches nothing relative to itself.

    Args:
        returns: ``[N]`` episode returns.
        groups: ``[N]`` int64 group ids (episodes of one env seed share one).
        keep: share of the groups to keep, in ``(0, 1]``.

    Returns:
        ``[N]`` bool, the kept episodes. Ties keep the group seen first.
    """
    ids, inverse = torch.unique(groups, return_inverse=True)
    n = len(ids)
    mean = torch.zeros(n, dtype=returns.dtype).index_add_(0, inverse, returns)
    count = torch.bincount(inverse, minlength=n).to(returns.dtype)
    mean = mean / count
    sq = torch.zeros(n, dtype=returns.dtype).index_add_(0, inverse, (returns - mean[inverse]) ** 2)
    std = (sq / count).sqrt()  # population std: a group of one has 0
    k = max(1, math.ceil(keep * n - 1e-9))
    first_seen = torch.full((n,), len(groups), dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(len(groups)), reduce="amin"
    )
    order = sorted(range(n), key=lambda g: (-float(std[g]), int(first_seen[g])))
    kept = torch.zeros(n, dtype=torch.bool)
    kept[order[:k]] = True
    return kept[inverse]


def shuffled_returns(
    rewards: torch.Tensor, mask: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The null control's rewards: each episode's return (its row of ``rewards`` summed) goes to
    the last trained token of another episode (a random permutation of the batch); every other
    reward is 0. The returns keep their distribution and lose their link to what was done.

    Args:
        rewards: ``[B, T]`` per-token rewards.
        mask: ``[B, T]`` bool, the trained tokens (an episode without one gets nothing).
        generator: draws the permutation.

    Returns:
        ``[B, T]`` rewards.
    """
    returns = rewards.sum(1)
    perm = torch.randperm(len(returns), generator=generator)
    m = mask.long()
    last = (m.cumsum(1) == m.sum(1, keepdim=True)) & mask.bool()
    rows, cols = last.nonzero(as_tuple=True)
    out = torch.zeros_like(rewards)
    out[rows, cols] = returns[perm][rows]
    return out


def token_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    terminated: torch.Tensor,
    bootstrap: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the trained tokens of multi-turn sequences, skipping observation tokens.

    The agent's tokens of every row are taken in order (observation text between turns is
    the environment's move, not a decision): token ``k``'s successor is the next trained
    token, whose value already reads the new observation. After the last trained token the
    episode either terminated (no bootstrap) or was truncated (bootstrap from ``bootstrap``,
    the value after the final observation). Then :func:`gae` runs on the compacted rows and
    the result is scattered back.

    Args:
        rewards: ``[B, T]`` per-token rewards (the turn reward on its last token).
        values: ``[B, T]`` value of the state in which each token was chosen.
        mask: ``[B, T]`` bool, trained tokens.
        terminated: ``[B]`` bool.
        bootstrap: ``[B]`` value after the last token (used when not terminated).
        gamma, lam: discount and GAE λ, per token.

    Returns:
        ``(advantages, returns)``, ``[B, T]``, zero outside the mask.
    """
    B, T = rewards.shape
    mask = mask.bool()
    # Stable sort puts each row's trained tokens first, in their original order.
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # (B, T)
    n = mask.sum(1)  # (B,)
    c_mask = torch.gather(mask, 1, order)
    c_rewards = torch.gather(rewards, 1, order) * c_mask
    c_values = torch.gather(values, 1, order) * c_mask
    idx = torch.arange(T, device=rewards.device)
    is_last = idx[None, :] == (n - 1).clamp(min=0)[:, None]  # (B, T)
    next_values = torch.cat([c_values[:, 1:], c_values.new_zeros(B, 1)], dim=1)
    boot = torch.where(terminated.bool(), torch.zeros_like(bootstrap), bootstrap)
    next_values = torch.where(is_last, boot[:, None].to(next_values.dtype), next_values)
    c_term = is_last & terminated.bool()[:, None]
    ends = is_last | ~c_mask
    c_adv, _ = gae(c_rewards, c_values, next_values, c_term, ends, gamma, lam)
    c_adv = c_adv * c_mask
    advantages = torch.zeros_like(rewards).scatter(1, order, c_adv)
    returns = (advantages + values) * mask
    return advantages, returns


# --------------------------------------------------------------------------- LM algorithms


@dataclass
class AdvantageResult:
    advantages: torch.Tensor  # (B, T), zero outside the mask
    returns: torch.Tensor | None  # (B, T) value targets, or None when no value head is trained


AdvantageFn = Callable[..., AdvantageResult]
_SINGLE = Parallel()
ALGORITHMS: Registry[AdvantageFn] = Registry("algorithm")
"""The LM trainer's algorithms (``algo.name``), each an advantage estimator over a scored
batch: ``fn(traj, scored, rewards, algo_cfg, par=Parallel) -> AdvantageResult``, where
``traj`` is a :class:`tokenergy.rollout.Trajectories` and ``scored`` a
:class:`tokenergy.rollout.Scored`. A statistic over the batch goes through ``par``
(:mod:`tokenergy.distributed`), so several processes compute what one would on the global batch.

- ``ppo``: token-level GAE across turns (:func:`token_gae`), with the value head; an episode
  the turn limit cut off is bootstrapped from its last value or, with ``truncation:
  terminal``, valued as ended.
- ``grpo``: :func:`group_relative` episode returns (G episodes per env seed) on every token
  (Shao et al., 2024, arXiv:2402.03300).
- ``reinforce``: discounted return-to-go minus the batch's mean episode return.
"""


@ALGORITHMS.register("ppo")
def _ppo_advantages(
    traj: Any, sc: Any, rewards: torch.Tensor, cfg: Any, par: Parallel = _SINGLE
) -> AdvantageResult:
    # "terminal": an episode the limit cut off is valued as ended (no bootstrap)
    ended = traj.terminated | (cfg.truncation == "terminal")
    adv, ret = token_gae(rewards, sc.values, traj.mask, ended, sc.bootstrap, cfg.gamma, cfg.lam)
    return AdvantageResult(adv, ret)


@ALGORITHMS.register("grpo")
def _grpo_advantages(
    traj: Any, sc: Any, rewards: torch.Tensor, cfg: Any, par: Parallel = _SINGLE
) -> AdvantageResult:
    # An episode's score is its total reward (the KL penalty included when it is a reward).
    per_episode = (rewards * traj.mask).sum(1)
    adv = group_relative(per_episode, traj.groups, scale=cfg.group_scale)
    return AdvantageResult(adv[:, None] * traj.mask, None)


@ALGORITHMS.register("reinforce")
def _reinforce_advantages(
    traj: Any, sc: Any, rewards: torch.Tensor, cfg: Any, par: Parallel = _SINGLE
) -> AdvantageResult:
    # Return-to-go over the agent's tokens is GAE with V = 0 and lambda = 1, no bootstrap.
    zeros = torch.zeros_like(rewards)
    to_go, _ = token_gae(rewards, zeros, traj.mask, traj.terminated, zeros[:, 0], cfg.gamma, 1.0)
    baseline = par.mean((rewards * traj.mask).sum(1))  # the global batch's mean return
    return AdvantageResult((to_go - baseline) * traj.mask, None)

"""The action-bottleneck diagnostic: which tokens does the episode's outcome depend on?

For ``G`` rollouts from the same environment seed, sum each role's token log-probabilities
per episode and correlate that sum with the episode return across the ``G`` rollouts. A role
whose choices decide the outcome shows a large ``|corr|``; in agent trajectories the action
tokens are few (a small share of the trained tokens) yet carry most of the correlation: the
*action bottleneck* that ActFocus targets (He et al., arXiv:2605.14558).

:func:`role_reward_correlation` is the pure computation; :func:`action_bottleneck` rolls the
agent out and applies it. Metrics are ``diag/*`` (see docs/metrics.md).
"""

from __future__ import annotations

import math

import torch

from tokenergy.types import Role

__all__ = ["DIAG_ROLES", "action_bottleneck", "role_reward_correlation"]

DIAG_ROLES = (Role.REASONING, Role.ACTION)


def _corr(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Pearson correlation, or ``None`` when either side is constant."""
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    den = math.sqrt(float((x * x).sum()) * float((y * y).sum()))
    if den < 1e-12:
        return None
    return float((x * y).sum()) / den


def role_reward_correlation(
    logprobs: torch.Tensor,
    roles: torch.Tensor,
    mask: torch.Tensor,
    returns: torch.Tensor,
    groups: torch.Tensor,
) -> dict[str, float]:
    """Per role, the mean over groups of ``|corr(Σ_role log π, return)|`` and the token share.

    Args:
        logprobs: ``[B, T]`` log π(token).
        roles: ``[B, T]`` :class:`~tokenergy.types.Role` values.
        mask: ``[B, T]`` bool, the agent's tokens.
        returns: ``[B]`` episode returns.
        groups: ``[B]`` int, rollouts of one env seed share a group id.

    Returns:
        ``corr_<role>`` (NaN when no group has both sides varying), ``share_<role>`` (the
        role's share of the agent's tokens) and ``groups_<role>`` (groups that counted), for
        ``reasoning`` and ``action``; and ``corr_mean_<role>``, the same with the role's *mean*
        token log-probability, which removes what the sums share with episode length (a
        longer episode has a more negative sum in every role).
    """
    out: dict[str, float] = {}
    m = mask.bool()
    total = max(int(m.sum()), 1)
    for role in DIAG_ROLES:
        rm = m & (roles == int(role))
        sums = (logprobs.double() * rm).sum(1)
        means = sums / rm.sum(1).clamp(min=1)
        name = role.name.lower()
        for key, per_episode in ((f"corr_{name}", sums), (f"corr_mean_{name}", means)):
            cs = []
            for g in torch.unique(groups):
                rows = groups == g
                c = _corr(per_episode[rows], returns[rows])
                if c is not None:
                    cs.append(abs(c))
            out[key] = sum(cs) / len(cs) if cs else float("nan")
            if key == f"corr_{name}":
                out[f"groups_{name}"] = float(len(cs))
        out[f"share_{name}"] = int(rm.sum()) / total
    return out


@torch.no_grad()
def action_bottleneck(agent, cfg, seeds: int, group: int, generator: torch.Generator) -> dict:
    """Roll out ``group`` episodes on each of ``seeds`` env seeds (the run's rollout sampling)
    and return :func:`role_reward_correlation` as ``diag/*`` metrics.

    The env seeds are held out (above ``eval.seed_offset + eval.episodes``), the same at every
    call, so values over training are comparable.
    """
    from tokenergy.algos.lm import run_episodes
    from tokenergy.rollout import score

    base = cfg.eval.seed_offset + cfg.eval.episodes
    env_seeds = [base + i for i in range(seeds) for _ in range(group)]
    was_training = agent.training
    agent.eval()
    groups = [i // group for i in range(len(env_seeds))]
    traj = run_episodes(agent, cfg, env_seeds, generator=generator, groups=groups)
    sc = score(agent, None, traj)
    agent.train(was_training)
    res = role_reward_correlation(
        sc.logprobs, traj.roles, traj.mask, traj.episode_return, traj.groups
    )
    return {f"diag/{k}": v for k, v in res.items()}

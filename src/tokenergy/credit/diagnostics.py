"""The action-bottleneck diagnostics: which tokens does the episode's outcome depend on?

For ``G`` rollouts from the same environment seed, sum each role's token log-probabilities
per episode and correlate that sum with the episode return across the ``G`` rollouts. A role
whose choices decide the outcome shows a large ``|corr|``; in agent trajectories the action
tokens are few (a small share of the trained tokens) yet carry most of the correlation: the
*action bottleneck* that ActFocus targets (He et al., arXiv:2605.14558).

:func:`role_reward_correlation` is the pure computation; :func:`action_bottleneck` rolls the
agent out and applies it. Metrics are ``diag/*`` (see docs/metrics.md).

The ActFocus paper's own diagnostic is :func:`energy_reward_std_correlation`: per group the
std of the episodes' returns ``sigma_g``; across groups, the Spearman correlation (with its
two-sided p-value) between ``sigma_g`` and the group's mean energy over action tokens, over
reasoning tokens and over all the agent's tokens. Groups whose episodes vary are groups the
update can learn from; an energy that predicts them where the decision is made (the action
tokens) is what ActFocus up-weights.
"""

from __future__ import annotations

import math
import statistics

import torch

from tokenergy.types import Role

__all__ = [
    "DIAG_ROLES",
    "action_bottleneck",
    "energy_reward_std_correlation",
    "mean_interval",
    "role_reward_correlation",
    "spearman",
    "t_critical",
    "t_two_sided_p",
]

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


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b)`` (continued fraction, Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast below the mean only
        return 1.0 - _betainc(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(log_front + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * h


def t_two_sided_p(t: float, df: int) -> float:
    """Two-sided p-value of Student's t statistic ``t`` with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"t_two_sided_p: df must be >= 1, got {df}")
    if math.isinf(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_critical(df: int, level: float = 0.95) -> float:
    """Student's t value with ``df`` degrees of freedom whose two-sided tail probability is
    ``1 - level`` (12.706 for df 1, 4.303 for df 2 at 95%): bisection on :func:`t_two_sided_p`,
    which falls as ``t`` grows."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"t_critical: level must lie in (0, 1), got {level}")
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > 1.0 - level:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > 1.0 - level else (lo, mid)
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def mean_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """The mean of ``values`` and the half-width of its t interval at ``level``
    (``t_critical(n - 1) * sd / sqrt(n)``); the half-width is ``nan`` for a single value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval: no values")
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan
    return mean, t_critical(n - 1, level) * statistics.stdev(values) / math.sqrt(n)


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks from 1, ties given their average rank."""
    x = x.double()
    order = x.argsort()
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(1, len(x) + 1, dtype=torch.float64)
    for v in x.unique():
        tied = x == v
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Spearman's rank correlation of two ``[n]`` samples and its two-sided p-value (the t
    approximation with ``n - 2`` degrees of freedom). ``(nan, nan)`` when ``n < 3`` or either
    sample is constant."""
    if len(x) != len(y):
        raise ValueError(f"spearman: samples of {len(x)} and {len(y)} values")
    n = len(x)
    rho = _corr(_ranks(x), _ranks(y)) if n >= 3 else None
    if rho is None:
        return float("nan"), float("nan")
    rho = max(-1.0, min(1.0, rho))
    if abs(rho) == 1.0:
        return rho, 0.0
    return rho, t_two_sided_p(rho * math.sqrt((n - 2) / (1.0 - rho * rho)), n - 2)


def energy_reward_std_correlation(
    energy: torch.Tensor,
    roles: torch.Tensor,
    mask: torch.Tensor,
    returns: torch.Tensor,
    groups: torch.Tensor,
) -> dict[str, float]:
    """The ActFocus paper's diagnostic (see the module docstring).

    Args:
        energy: ``[B, T]`` per-token energy (the paper's: the frozen reference's free energy).
        roles: ``[B, T]`` :class:`~tokenergy.types.Role` values.
        mask: ``[B, T]`` bool, the agent's tokens.
        returns: ``[B]`` episode returns.
        groups: ``[B]`` int, rollouts of one env seed share a group id.

    Returns:
        ``energy_spearman_<part>`` and ``energy_p_<part>`` for ``action``, ``reasoning`` and
        ``all``: Spearman's rho across groups between the return std ``sigma_g`` (population)
        and the group's mean energy over that part's tokens, with its p-value (NaN when
        fewer than 3 groups have such tokens or either side is constant);
        ``energy_groups``, the number of groups; ``reward_std_mean``, the mean ``sigma_g``.
    """
    m = mask.bool()
    parts = {
        "action": m & (roles == int(Role.ACTION)),
        "reasoning": m & (roles == int(Role.REASONING)),
        "all": m,
    }
    ids = torch.unique(groups)
    sigma = torch.stack([returns[groups == g].double().std(unbiased=False) for g in ids])
    out: dict[str, float] = {
        "energy_groups": float(len(ids)),
        "reward_std_mean": float(sigma.mean()),
    }
    for name, pm in parts.items():
        e, s = [], []
        for i, g in enumerate(ids.tolist()):
            rows = groups == g
            n = pm[rows].sum()
            if n > 0:
                e.append(float((energy[rows].double() * pm[rows]).sum() / n))
                s.append(float(sigma[i]))
        rho, p = spearman(torch.tensor(s), torch.tensor(e)) if e else (math.nan, math.nan)
        out[f"energy_spearman_{name}"] = rho
        out[f"energy_p_{name}"] = p
    return out


@torch.no_grad()
def action_bottleneck(
    agent, cfg, seeds: int, group: int, generator: torch.Generator, reference=None
) -> dict:
    """Roll out ``group`` episodes on each of ``seeds`` env seeds (the run's rollout sampling)
    and return :func:`role_reward_correlation` and :func:`energy_reward_std_correlation` as
    ``diag/*`` metrics.

    The energy is ``reference``'s free energy on the agent's tokens (the paper's), or the
    agent's own when there is no reference (the same thing for the agent RL starts from).
    The env seeds are held out (above ``eval.seed_offset + eval.episodes``), the same at every
    call, so values over training are comparable.
    """
    from tokenergy.rollout import score
    from tokenergy.rollout.episodes import run_episodes

    base = cfg.eval.seed_offset + cfg.eval.episodes
    env_seeds = [base + i for i in range(seeds) for _ in range(group)]
    was_training = agent.training
    agent.eval()
    groups = [i // group for i in range(len(env_seeds))]
    traj = run_episodes(agent, cfg, env_seeds, generator=generator, groups=groups)
    extra = "ref_free_energy" if reference is not None else "free_energy"
    sc = score(agent, reference, traj, extras=frozenset({extra}))
    agent.train(was_training)
    res = role_reward_correlation(
        sc.logprobs, traj.roles, traj.mask, traj.episode_return, traj.groups
    )
    energy = sc.ref_free_energy if reference is not None else sc.free_energy
    res |= energy_reward_std_correlation(
        energy, traj.roles, traj.mask, traj.episode_return, traj.groups
    )
    return {f"diag/{k}": v for k, v in res.items()}

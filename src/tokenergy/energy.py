"""Per-token energies and the loss weights derived from them.

An *energy* ``E_t`` is a ``[B, T]`` score of how uncertain or unfit token ``t`` is (high =
worth more of the gradient). Energies and weights are computed without gradient: they decide
how the loss is spread, they are not optimised.

Two registries make them plug-ins referred to by name in configs:

- ``ENERGY_SOURCES``: ``fn(inputs: EnergyInputs, cfg) -> energy [B, T]``
- ``WEIGHTINGS``: ``fn(energy, mask, cfg) -> (weights [B, T], bottleneck [B, T] bool)``

and two more for token-level (language-model) agents, whose tokens carry a
:class:`~tokenergy.types.Role`:

- ``TOKEN_ENERGIES``: ``fn(inputs: TokenEnergyInputs, cfg) -> energy [B, T]``
- ``TOKEN_WEIGHTINGS``: ``fn(energy, roles, mask, cfg, reduce_sum=None) -> weights [B, T]``
  (``reduce_sum`` sums over data-parallel processes: ``actfocus`` then takes its batch
  statistics over the global batch; the others normalise within this process's share)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tokenergy.ops import masked_mean, masked_var
from tokenergy.registry import Registry
from tokenergy.types import Role

__all__ = [
    "ENERGY_SOURCES",
    "TOKEN_ENERGIES",
    "TOKEN_WEIGHTINGS",
    "WEIGHTINGS",
    "EnergyInputs",
    "TokenEnergyInputs",
    "actfocus_softmax_weights",
    "actfocus_weights",
    "advantage_energy",
    "bottleneck_weights",
    "energy_prior_kl",
    "entropy",
    "free_energy",
    "kl_full",
    "ngram_repeat",
    "shaped_rewards",
    "shuffle_within_roles",
    "shuffled_weights",
    "surprisal",
    "top_fraction_weights",
    "zscore",
]


# --------------------------------------------------------------------------- pure functions


@torch.no_grad()
def free_energy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Helmholtz free energy of the next-token distribution: ``F = -T * logsumexp(logits / T)``.

    Energy-based view of a classifier (Liu et al., 2020, arXiv:2010.03759): low (very
    negative) free energy means the model puts a confident, high logit somewhere.

    Args:
        logits: ``[B, T, V]``.
        temperature: ``T > 0``.

    Returns:
        ``[B, T]``.
    """
    return -temperature * torch.logsumexp(logits / temperature, dim=-1)


@torch.no_grad()
def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy ``H = -Σ_v p_v log p_v`` of ``softmax(logits)``, ``[B, T, V] -> [B, T]``."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


@torch.no_grad()
def surprisal(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``-log softmax(logits)[token]``: how unexpected each taken token is.

    Args:
        logits: ``[B, T, V]``.
        tokens: ``[B, T]`` int64 indices into ``V``.

    Returns:
        ``[B, T]``.
    """
    logp = torch.log_softmax(logits, dim=-1)
    return -logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def advantage_energy(advantages: torch.Tensor, beta: float) -> torch.Tensor:
    """``E_t = sigmoid(-β A_t)``: near 1 for clearly bad actions, near 0 for clearly good ones."""
    return torch.sigmoid(-beta * advantages)


@torch.no_grad()
def zscore(energy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(E - mean) / (std + 1e-8)`` with mean and population std over masked positions."""
    mean = masked_mean(energy, mask)
    std = masked_var(energy, mask).sqrt()
    return (energy - mean) / (std + 1e-8)


@torch.no_grad()
def bottleneck_weights(
    energy: torch.Tensor,
    mask: torch.Tensor,
    threshold_std: float = 1.5,
    weight_scale: float = 2.0,
    smooth: bool = False,
) -> torch.Tensor:
    """Z-score bottleneck weights: up-weight tokens whose energy is unusually high.

    ``z = (E - mean) / (std + 1e-8)`` over masked positions. Hard: ``weight_scale`` where
    ``z > threshold_std``, else 1. Smooth: ``1 + (weight_scale - 1) * sigmoid(z - threshold_std)``.
    Unmasked positions get 0.

    Args:
        energy: ``[B, T]``.
        mask: ``[B, T]`` bool.
        threshold_std: z above which a token counts as a bottleneck.
        weight_scale: weight of a bottleneck token.
        smooth: sigmoid ramp instead of a step.

    Returns:
        ``[B, T]`` weights.
    """
    z = zscore(energy, mask)
    if smooth:
        w = 1.0 + (weight_scale - 1.0) * torch.sigmoid(z - threshold_std)
    else:
        w = torch.where(z > threshold_std, torch.full_like(z, weight_scale), torch.ones_like(z))
    return w * mask.to(w.dtype)


@torch.no_grad()
def shuffled_weights(
    weights: torch.Tensor, mask: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The same weights randomly permuted among the masked positions.

    The control for any energy weighting: it keeps the distribution of weights (and so the
    effective step size) and drops the information of *which* tokens the energy picked.

    Args:
        weights: ``[B, T]``.
        mask: ``[B, T]`` bool.
        generator: CPU generator for the permutation.

    Returns:
        ``[B, T]``; unmasked positions keep their value.
    """
    flat_mask = mask.reshape(-1).bool()
    idx = flat_mask.nonzero(as_tuple=True)[0]
    perm = torch.randperm(idx.numel(), generator=generator).to(idx.device)
    out = weights.reshape(-1).clone()
    out[idx] = out[idx[perm]]
    return out.view_as(weights)


@torch.no_grad()
def kl_full(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """Exact per-position ``KL(π_θ ‖ π_ref) = Σ_v π_θ(v) (log π_θ(v) - log π_ref(v))``.

    Unlike the sampled estimators of :func:`tokenergy.losses.kl_estimate` this reads the whole
    next-token distribution, so it is never negative and does not depend on the taken token.

    Args:
        logits: ``[B, T, V]`` policy logits.
        ref_logits: ``[B, T, V]`` reference logits.

    Returns:
        ``[B, T]``.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    logq = torch.log_softmax(ref_logits.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1)


@torch.no_grad()
def ngram_repeat(tokens: torch.Tensor, mask: torch.Tensor, n: int = 3) -> torch.Tensor:
    """1 where the ``n``-gram ending at a trained token already occurred earlier in its row.

    A cheap rule-based energy for degenerate loops ("Up Up Up …", a scratchpad copied turn
    after turn): the n-gram ``tokens[t-n+1 : t+1]`` is compared with every earlier n-gram of
    the same trajectory (observation text included, so repeating the environment is caught
    too). Positions with fewer than ``n`` tokens before them, and untrained positions, are 0.

    Args:
        tokens: ``[B, T]`` int64.
        mask: ``[B, T]`` bool, the trained tokens.
        n: n-gram length, ``>= 1``.

    Returns:
        ``[B, T]`` float in ``{0, 1}``.
    """
    if n < 1:
        raise ValueError(f"ngram_repeat: n must be >= 1, got {n}")
    b, t = tokens.shape
    out = torch.zeros(b, t, dtype=torch.float32, device=tokens.device)
    if t < n:
        return out
    grams = tokens.unfold(1, n, 1)  # (B, T-n+1, n): gram j ends at token j+n-1
    same = (grams[:, :, None, :] == grams[:, None, :, :]).all(-1)  # (B, G, G)
    earlier = torch.ones(same.shape[1:], dtype=torch.bool, device=tokens.device).tril(-1)
    seen = (same & earlier).any(-1)  # gram j equals some earlier gram
    out[:, n - 1 :] = seen.float()
    return out * mask.float()


def _role_masks(roles: torch.Tensor, mask: torch.Tensor) -> dict[Role, torch.Tensor]:
    m = mask.bool()
    return {r: (roles == int(r)) & m for r in (Role.REASONING, Role.ACTION, Role.FORMAT)}


@torch.no_grad()
def actfocus_weights(
    roles: torch.Tensor,
    energy: torch.Tensor,
    mask: torch.Tensor,
    alpha: float = 0.1,
    beta: float = 0.5,
    format_weight: float = 1.0,
    eps: float = 1e-6,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """ActFocus per-token loss weights as the paper defines them (He et al., arXiv:2605.14558).

    ``alpha`` on trained reasoning tokens; ``1 + beta * sigmoid((E - mu) / sigma)`` on trained
    action tokens, where ``mu`` and ``sigma = sqrt(mean((E - mu)^2) + eps)`` are taken over the
    trained action tokens of the whole batch; ``format_weight`` on trained tag tokens; 0 where
    ``mask`` is false. Action weights lie in ``[1, 1 + beta]``; a single action token gets
    ``1 + beta / 2``. ``alpha = 1, beta = 0`` (and ``format_weight = 1``) is uniform.

    Args:
        roles: ``[B, T]`` :class:`~tokenergy.types.Role` values.
        energy: ``[B, T]`` (the paper's: the frozen reference's free energy).
        mask: ``[B, T]`` bool, the trained tokens.
        alpha: reasoning-token weight.
        beta: action-weight strength.
        format_weight: weight of the tag tokens.
        eps: added to the variance before the square root.
        reduce_sum: under data parallelism, the sum of a tensor over the processes
            (:meth:`tokenergy.distributed.Parallel.sum`): ``mu`` and ``sigma`` are then those
            of every process's action tokens, the batch this process holds a share of. Every
            process must call it (it is a collective).

    Returns:
        ``[B, T]`` float32 weights.
    """
    masks = _role_masks(roles, mask)
    w = torch.zeros(energy.shape, dtype=torch.float32, device=energy.device)
    w[masks[Role.REASONING]] = float(alpha)
    w[masks[Role.FORMAT]] = float(format_weight)
    act = masks[Role.ACTION]
    e = energy[act].double()
    if reduce_sum is None:
        if e.numel() == 0:
            return w
        mu = e.mean()
        sigma = torch.sqrt(((e - mu) ** 2).mean() + eps)
    else:
        n, total, squares = reduce_sum(
            torch.stack([e.new_tensor(e.numel()), e.sum(), (e * e).sum()])
        )
        if e.numel() == 0:
            return w
        mu = total / n
        sigma = torch.sqrt((squares / n - mu * mu).clamp(min=0.0) + eps)
    w[act] = (1.0 + beta * torch.sigmoid((e - mu) / sigma)).float()
    return w


@torch.no_grad()
def actfocus_softmax_weights(
    roles: torch.Tensor,
    energy: torch.Tensor,
    mask: torch.Tensor,
    alpha: float,
    lam: float,
    tau: float,
    format_weight: float = 1.0,
) -> torch.Tensor:
    """Our softmax variant of ActFocus weights (not the paper's form: that is
    :func:`actfocus_weights`). It can put hundreds of times the mean weight on a few action
    tokens of a batch (docs/results/actfocus).

    Base weight ``w0``: ``alpha`` on reasoning tokens, 1 on action tokens, ``format_weight`` on
    format tokens, 0 outside ``mask``. Over the ``N_a`` action tokens of the whole batch,
    ``s = softmax(energy / tau)`` (those tokens only) and an action token gets
    ``w = w0 * (1 + lam * (N_a * s - 1))``; every other token keeps ``w0``. For
    ``0 <= lam <= 1`` the weights stay non-negative and their mean over action tokens is 1:
    the redistribution moves weight between action tokens, toward the uncertain
    (high-energy) ones, without changing the total. ``lam = 0`` is reasoning down-weighting
    alone; ``alpha = 1`` is redistribution alone.

    Args:
        roles: ``[B, T]`` :class:`~tokenergy.types.Role` values.
        energy: ``[B, T]``.
        mask: ``[B, T]`` bool, the trained tokens.
        alpha: reasoning-token weight.
        lam: redistribution strength.
        tau: softmax temperature, ``> 0``; large ``tau`` flattens ``s`` toward uniform.
        format_weight: weight of the tag tokens.

    Returns:
        ``[B, T]`` weights.
    """
    if tau <= 0:
        raise ValueError(f"actfocus_softmax_weights: tau must be > 0, got {tau}")
    masks = _role_masks(roles, mask)
    w = torch.zeros_like(energy, dtype=torch.float32)
    w[masks[Role.REASONING]] = float(alpha)
    w[masks[Role.FORMAT]] = float(format_weight)
    act = masks[Role.ACTION]
    n_a = int(act.sum())
    if n_a:
        s = torch.softmax(energy[act].float() / tau, dim=0)
        w[act] = 1.0 + lam * (n_a * s - 1.0)
    return w


@torch.no_grad()
def top_fraction_weights(energy: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor:
    """Keep the ``ceil(rho * N)`` highest-energy trained tokens of the batch, drop the rest.

    With the entropy as energy this is the "high-entropy minority" update of Wang et al.,
    *Beyond the 80/20 rule* (arXiv:2506.01939). Kept tokens get weight ``1 / rho`` so the
    mean weight over trained tokens stays 1 (the same step size as no weighting).

    Args:
        energy: ``[B, T]``.
        mask: ``[B, T]`` bool.
        rho: kept fraction in ``(0, 1]``.

    Returns:
        ``[B, T]`` weights.
    """
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"top_fraction_weights: rho must be in (0, 1], got {rho}")
    m = mask.bool()
    w = torch.zeros_like(energy, dtype=torch.float32)
    n = int(m.sum())
    if n == 0:
        return w
    k = max(1, math.ceil(rho * n))
    vals = energy[m].float()
    kept = torch.zeros(n, dtype=torch.bool, device=energy.device)
    kept[torch.topk(vals, k).indices] = True
    w[m] = kept.float() * (n / k)
    return w


@torch.no_grad()
def shuffle_within_roles(
    weights: torch.Tensor,
    roles: torch.Tensor,
    mask: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The control of a token weighting: permute its weights among trained tokens of one role.

    Reasoning weights stay on reasoning tokens and action weights on action tokens (so
    reasoning down-weighting survives); what is lost is *which* token of a role got more.
    """
    out = weights.clone()
    for m in _role_masks(roles, mask).values():
        out = torch.where(m, shuffled_weights(out, m, generator), out)
    return out


@torch.no_grad()
def shaped_rewards(
    rewards: torch.Tensor,
    energy: torch.Tensor,
    roles: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    shaped_roles: tuple[Role, ...] = (Role.REASONING, Role.ACTION),
) -> torch.Tensor:
    """``r_t - beta * standardized(E_t)`` on the trained tokens of ``shaped_roles``.

    The energy is standardised (mean 0, std 1) over those tokens of the batch, so ``beta`` is
    in units of reward per standard deviation of energy and the shaping sums to ~0 over the
    batch. Other tokens keep their reward.
    """
    m = mask.bool() & torch.isin(roles, torch.tensor([int(r) for r in shaped_roles]))
    if not bool(m.any()):
        return rewards.clone()
    return rewards - beta * zscore(energy.float(), m) * m.float()


def energy_prior_kl(
    logits: torch.Tensor,
    vocab_energy: torch.Tensor,
    mask: torch.Tensor,
    tau: float = 1.0,
) -> torch.Tensor:
    """Energy as a prior: token-mean ``KL(π_θ(·|s) ‖ π_E(·|s))`` with ``π_E ∝ exp(-E / tau)``.

    ``vocab_energy [B, T, V]`` scores every vocabulary entry at each position (by default
    the reference surprisal ``-log π_ref(v|s)``, which makes ``π_E`` a softened reference:
    ``π_ref^{1/tau}``, renormalised). Gradient flows into ``logits`` only.

    Args:
        logits: ``[B, T, V]`` policy logits (with gradient).
        vocab_energy: ``[B, T, V]``, treated as a constant.
        mask: ``[B, T]`` bool.
        tau: prior temperature, ``> 0``.

    Returns:
        0-dim loss.
    """
    if tau <= 0:
        raise ValueError(f"energy_prior_kl: tau must be > 0, got {tau}")
    logp = torch.log_softmax(logits.float(), dim=-1)
    log_prior = torch.log_softmax(-vocab_energy.detach().float() / tau, dim=-1)
    kl = (logp.exp() * (logp - log_prior)).sum(-1)
    return masked_mean(kl, mask)


# --------------------------------------------------------------------------- registries


@dataclass
class EnergyInputs:
    """What an energy source may read. Fields a trainer cannot provide stay ``None``.

    For a vector-observation env a step is one token and the action set is the vocabulary.
    """

    mask: torch.Tensor  # (B, T) bool
    logits: torch.Tensor | None = None  # (B, T, V) policy logits at rollout time
    tokens: torch.Tensor | None = None  # (B, T) int64 taken tokens / actions
    advantages: torch.Tensor | None = None  # (B, T)


EnergySource = Callable[[EnergyInputs, Any], torch.Tensor]
Weighting = Callable[[torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, torch.Tensor]]

ENERGY_SOURCES: Registry[EnergySource] = Registry("energy source")
WEIGHTINGS: Registry[Weighting] = Registry("weighting")


def _need(inputs: EnergyInputs, field: str, source: str) -> torch.Tensor:
    value = getattr(inputs, field)
    if value is None:
        raise ValueError(
            f"energy source {source!r} needs {field!r}, which this trainer does not provide"
        )
    return value


@ENERGY_SOURCES.register("advantage")
def _advantage_source(inputs: EnergyInputs, cfg: Any) -> torch.Tensor:
    return advantage_energy(_need(inputs, "advantages", "advantage"), cfg.beta)


@ENERGY_SOURCES.register("entropy")
def _entropy_source(inputs: EnergyInputs, cfg: Any) -> torch.Tensor:
    return entropy(_need(inputs, "logits", "entropy"))


@ENERGY_SOURCES.register("surprisal")
def _surprisal_source(inputs: EnergyInputs, cfg: Any) -> torch.Tensor:
    return surprisal(_need(inputs, "logits", "surprisal"), _need(inputs, "tokens", "surprisal"))


@ENERGY_SOURCES.register("free_energy")
def _free_energy_source(inputs: EnergyInputs, cfg: Any) -> torch.Tensor:
    return free_energy(_need(inputs, "logits", "free_energy"), cfg.temperature)


@WEIGHTINGS.register("none")
def _no_weighting(energy: torch.Tensor, mask: torch.Tensor, cfg: Any):
    z = zscore(energy, mask)
    return mask.to(energy.dtype), (z > cfg.threshold_std) & mask.bool()


@WEIGHTINGS.register("bottleneck")
def _bottleneck_weighting(energy: torch.Tensor, mask: torch.Tensor, cfg: Any):
    z = zscore(energy, mask)
    w = bottleneck_weights(energy, mask, cfg.threshold_std, cfg.weight_scale, cfg.smooth)
    return w, (z > cfg.threshold_std) & mask.bool()


# --------------------------------------------------------------------------- token-level


@dataclass
class TokenEnergyInputs:
    """What a token-level energy source may read; all ``[B, T]`` and aligned with the tokens
    (position ``t`` describes the choice of token ``t``). Fields a run cannot provide stay
    ``None`` and a source that needs one says so.
    """

    tokens: torch.Tensor  # (B, T) int64
    roles: torch.Tensor  # (B, T) Role values
    mask: torch.Tensor  # (B, T) bool, the trained tokens
    logprobs: torch.Tensor | None = None  # log π_θ(token) at rollout time
    ref_logprobs: torch.Tensor | None = None  # log π_ref(token)
    entropy: torch.Tensor | None = None  # H(π_θ(·|s_t))
    free_energy: torch.Tensor | None = None  # -logsumexp(logits_t)
    kl_ref: torch.Tensor | None = None  # exact KL(π_θ‖π_ref)(s_t)
    ref_free_energy: torch.Tensor | None = None  # -logsumexp(ref_logits_t)
    ref_entropy: torch.Tensor | None = None  # H(π_ref(·|s_t))
    advantages: torch.Tensor | None = None  # whitened advantages
    learned: Any = None  # a learned energy model (discriminator, ensemble) with .energy(inputs)


TokenEnergy = Callable[[TokenEnergyInputs, Any], torch.Tensor]
TokenWeighting = Callable[..., torch.Tensor]  # (energy, roles, mask, cfg, reduce_sum=None)

TOKEN_ENERGIES: Registry[TokenEnergy] = Registry("token energy source")
TOKEN_WEIGHTINGS: Registry[TokenWeighting] = Registry("token weighting")


def _needs(inputs: TokenEnergyInputs, field: str, source: str, hint: str = "") -> Any:
    value = getattr(inputs, field)
    if value is None:
        raise ValueError(f"energy source {source!r} needs {field!r}{hint}")
    return value.detach() if isinstance(value, torch.Tensor) else value


@TOKEN_ENERGIES.register("ref_surprisal")
def _ref_surprisal(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    return -_needs(inputs, "ref_logprobs", "ref_surprisal", " (a frozen reference)")


@TOKEN_ENERGIES.register("surprisal")
def _policy_surprisal(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    return -_needs(inputs, "logprobs", "surprisal")


@TOKEN_ENERGIES.register("entropy")
def _token_entropy(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    return _needs(inputs, "entropy", "entropy")


@TOKEN_ENERGIES.register("free_energy")
def _token_free_energy(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    return _needs(inputs, "free_energy", "free_energy")


@TOKEN_ENERGIES.register("ref_free_energy")
def _token_ref_free_energy(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    """The ActFocus paper's energy: ``E_t = -logsumexp_v f_ref[t, v]`` of the frozen reference."""
    return _needs(inputs, "ref_free_energy", "ref_free_energy", " (a frozen reference)")


@TOKEN_ENERGIES.register("ref_entropy")
def _token_ref_entropy(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    """The frozen reference's entropy at each position (a signal of the paper's ablation)."""
    return _needs(inputs, "ref_entropy", "ref_entropy", " (a frozen reference)")


@TOKEN_ENERGIES.register("logprob_shift")
def _token_logprob_shift(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    """``log π_old(y_t) - log π_ref(y_t)``: how far the policy has moved on the sampled token
    (a signal of the paper's ablation)."""
    old = _needs(inputs, "logprobs", "logprob_shift")
    return old - _needs(inputs, "ref_logprobs", "logprob_shift", " (a frozen reference)")


@TOKEN_ENERGIES.register("kl_ref")
def _token_kl_ref(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    return _needs(inputs, "kl_ref", "kl_ref", " (a frozen reference)")


@TOKEN_ENERGIES.register("ngram_repeat")
def _token_ngram(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    return ngram_repeat(inputs.tokens, inputs.mask, cfg.ngram)


@TOKEN_ENERGIES.register("advantage")
def _token_advantage(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    return advantage_energy(_needs(inputs, "advantages", "advantage"), cfg.adv_beta)


@TOKEN_ENERGIES.register("discriminator")
def _token_discriminator(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    return _needs(inputs, "learned", "discriminator", " (its trained model)").energy(inputs)


@TOKEN_ENERGIES.register("uncertainty")
def _token_uncertainty(inputs: TokenEnergyInputs, cfg: Any) -> torch.Tensor:
    return _needs(inputs, "learned", "uncertainty", " (its trained ensemble)").energy(inputs)


@TOKEN_WEIGHTINGS.register("none")
def _token_none(energy, roles, mask, cfg, reduce_sum=None) -> torch.Tensor:
    return mask.float()


@TOKEN_WEIGHTINGS.register("actfocus")
def _token_actfocus(energy, roles, mask, cfg, reduce_sum=None) -> torch.Tensor:
    return actfocus_weights(
        roles, energy, mask, cfg.alpha, cfg.beta, cfg.format_weight, reduce_sum=reduce_sum
    )


@TOKEN_WEIGHTINGS.register("actfocus_softmax")
def _token_actfocus_softmax(energy, roles, mask, cfg, reduce_sum=None) -> torch.Tensor:
    return actfocus_softmax_weights(
        roles, energy, mask, cfg.alpha, cfg.lam, cfg.tau, cfg.format_weight
    )


@TOKEN_WEIGHTINGS.register("bottleneck")
def _token_bottleneck(energy, roles, mask, cfg, reduce_sum=None) -> torch.Tensor:
    return bottleneck_weights(energy, mask, cfg.threshold_std, cfg.weight_scale, cfg.smooth)


@TOKEN_WEIGHTINGS.register("top_entropy")
def _token_top(energy, roles, mask, cfg, reduce_sum=None) -> torch.Tensor:
    return top_fraction_weights(energy, mask, cfg.top_rho)

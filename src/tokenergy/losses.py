"""Policy, value and KL losses as pure functions returning ``(loss, metrics)``.

``metrics`` values are detached 0-dim tensors (converted to floats only when logged, so no
device sync happens inside the update loop).
"""

from __future__ import annotations

from typing import Literal

import torch

from tokenergy.ops import masked_mean

__all__ = ["entropy_bonus", "kl_estimate", "ppo_policy_loss", "value_loss"]


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    weights: torch.Tensor | None = None,
    clip_eps_high: float | None = None,
    normalize: str = "mask",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate objective of PPO (Schulman et al., 2017, arXiv:1707.06347), per token.

    ``ratio_t = exp(logprobs_t - old_logprobs_t)``,
    ``l_t = max(-A_t * ratio_t, -A_t * clip(ratio_t, 1 - eps, 1 + eps_high))``, and
    ``loss = sum(mask * w * l) / sum(mask)`` (``normalize="mask"``): weights rescale each
    token's share of the gradient (energy weighting) but not the normaliser, so a weighting
    whose mean is 1 keeps the loss scale. ``normalize="weights"`` divides by
    ``sum(mask * w)`` instead, as the ActFocus paper (He et al., arXiv:2605.14558) does, so the
    weights decide where the gradient goes and not how large the loss is. ``clip_eps_high``
    gives the asymmetric "clip-higher" range of DAPO.

    Args:
        logprobs: ``[B, T]`` log π_θ(a_t | s_t), with gradient.
        old_logprobs: ``[B, T]`` log-probs at rollout time.
        advantages: ``[B, T]``.
        mask: ``[B, T]`` bool, the tokens that are trained.
        clip_eps: lower (and, by default, upper) clip range ε.
        weights: ``[B, T]`` per-token weights, treated as constants; ``None`` means 1.
        clip_eps_high: upper clip range; ``None`` means ``clip_eps``.
        normalize: ``"mask"`` or ``"weights"``: what the weighted sum is divided by.

    Returns:
        ``(loss, metrics)`` with ``policy_loss``, ``clipfrac`` (share of masked tokens whose
        ratio lies outside the clip range), ``approx_kl`` (k3 estimator of KL(old‖new):
        mean of ``(ratio - 1) - log ratio``), ``ratio_mean`` and ``ratio_max``.
    """
    if normalize not in ("mask", "weights"):
        raise ValueError(
            f"ppo_policy_loss: normalize must be 'mask' or 'weights', got {normalize!r}"
        )
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    mask_f = mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    adv = advantages.detach()
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)  # (B, T)
    w = mask_f if weights is None else mask_f * weights.detach()
    denom = w.sum() if normalize == "weights" else mask_f.sum()
    loss = (w * per_token).sum() / denom.clamp(min=1e-8 if normalize == "weights" else 1.0)
    with torch.no_grad():
        outside = (ratio < 1.0 - clip_eps) | (ratio > 1.0 + eps_high)
        masked_ratio = torch.where(mask.bool(), ratio, torch.zeros_like(ratio))
        metrics = {
            "policy_loss": loss.detach(),
            "clipfrac": masked_mean(outside.to(ratio.dtype), mask),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": masked_ratio.max() if masked_ratio.numel() else ratio.new_zeros(()),
        }
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Squared-error value loss with optional PPO-style value clipping.

    ``0.5 * masked_mean(max((v - R)^2, (old_v + clip(v - old_v, -c, c) - R)^2))``; the
    unclipped term alone when ``clip`` is ``None``.

    Args:
        values: ``[B, T]`` predictions with gradient.
        old_values: ``[B, T]`` predictions at rollout time.
        returns: ``[B, T]`` targets.
        mask: ``[B, T]`` bool.
        clip: value clip range ``c`` or ``None``.

    Returns:
        ``(loss, metrics)`` with ``value_loss`` and ``value_clipfrac``.
    """
    returns = returns.detach()
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token = unclipped
        clipfrac = values.new_zeros(())
    else:
        old_values = old_values.detach()
        v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (v_clipped - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        with torch.no_grad():
            clipfrac = masked_mean((clipped > unclipped).to(values.dtype), mask)
    loss = 0.5 * masked_mean(per_token, mask)
    return loss, {"value_loss": loss.detach(), "value_clipfrac": clipfrac}


def kl_estimate(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: Literal["k1", "k2", "k3"] = "k3",
) -> torch.Tensor:
    """Per-token Monte-Carlo estimate of KL(π‖π_ref) from tokens sampled from π (Schulman, 2020).

    With ``log r = logq - logp`` (``q`` the reference):
    ``k1 = -log r = logp - logq`` (unbiased, high variance, can be negative),
    ``k2 = 0.5 * (log r)^2`` (biased, low variance),
    ``k3 = r - 1 - log r`` (unbiased and non-negative).

    Args:
        logprobs: ``[B, T]`` log π(token).
        ref_logprobs: ``[B, T]`` log π_ref(token).
        kind: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        ``[B, T]`` per-token estimates (gradient flows through ``logprobs``).
    """
    log_r = ref_logprobs - logprobs
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r**2
    if kind == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"kl_estimate: kind must be 'k1', 'k2' or 'k3', got {kind!r}")


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean entropy (maximised, so it enters the total loss with a minus sign)."""
    return masked_mean(entropy, mask)

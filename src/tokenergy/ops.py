"""Masked reductions shared by every layer (advantages, energies, losses)."""

from __future__ import annotations

import torch

__all__ = ["masked_mean", "masked_var", "whiten"]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is true.

    Args:
        x: ``[...]`` values.
        mask: ``[...]`` bool or 0/1, same shape as ``x``.

    Returns:
        0-dim tensor; 0 when the mask is empty (rather than NaN, so an empty batch never
        poisons a running average).
    """
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = False) -> torch.Tensor:
    """Variance of ``x`` over masked positions (population variance unless ``unbiased``)."""
    m = mask.to(x.dtype)
    n = m.sum()
    mean = (x * m).sum() / n.clamp(min=1.0)
    sq = (((x - mean) * m) ** 2).sum()
    denom = (n - 1.0) if unbiased else n
    return sq / denom.clamp(min=1.0)


def whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Standardise ``x`` with the mean and population std of its masked positions.

    ``(x - mean) / sqrt(var + eps)`` on masked positions, 0 elsewhere. With
    ``shift_mean=False`` the mean is added back (only the scale changes), as TRL does for
    rewards.

    Args:
        x: ``[...]`` values.
        mask: ``[...]`` bool, same shape.

    Returns:
        Tensor shaped like ``x``.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)

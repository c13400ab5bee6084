"""Per-token energies and the loss weights derived from them.

An *energy* ``E_t`` is a ``[B, T]`` score of how uncertain or unfit token ``t`` is (high =
worth more of the gradient). Energies and weights are computed without gradient: they decide
how the loss is spread, they are not optimised.

Two registries make them plug-ins referred to by name in configs:

- ``ENERGY_SOURCES``: ``fn(inputs: EnergyInputs, cfg) -> energy [B, T]``
- ``WEIGHTINGS``: ``fn(energy, mask, cfg) -> (weights [B, T], bottleneck [B, T] bool)``
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tokenergy.ops import masked_mean, masked_var
from tokenergy.registry import Registry

__all__ = [
    "ENERGY_SOURCES",
    "WEIGHTINGS",
    "EnergyInputs",
    "advantage_energy",
    "bottleneck_weights",
    "entropy",
    "free_energy",
    "shuffled_weights",
    "surprisal",
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

"""Numerical safety for every trainer, and the safety envelope of the LM trainer.

Non-finite steps: a trainer takes a :class:`Snapshot` of the model and optimizer at the start of each
iteration (the last state known to be good). Before an optimizer step it asks
:func:`step_is_finite` about the loss and the gradient norm: a non-finite one skips the step
(counted in ``train/skipped_steps``). After a step, :func:`params_are_finite` catches weights
that a finite but huge update pushed to inf/NaN; then the snapshot is restored.

The rest of the envelope (Haque, Islam, Karray, SMC 2026; each part switchable, each logged
when it acts): :func:`clip_whiten_rewards` scales the environment's rewards by their batch std
after clipping them to ``mean ± clip·std``; a minibatch whose mean probability ratio exceeds
a cap is skipped (``algo.ratio_cap``, in the trainer); :class:`AdaptiveKL` moves the KL
coefficient toward a target KL (Ziegler et al., 2019, arXiv:1909.08593).
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch

from tokenergy.distributed import Parallel

__all__ = [
    "AdaptiveKL",
    "Snapshot",
    "autocast",
    "clip_whiten_rewards",
    "guarded_step",
    "params_are_finite",
    "step_is_finite",
    "turn_ends",
]


def step_is_finite(loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
    """True when both the loss and the (pre-clip) global gradient norm are finite."""
    return bool(torch.isfinite(loss).all()) and bool(torch.isfinite(grad_norm).all())


@torch.no_grad()
def params_are_finite(model: torch.nn.Module) -> bool:
    """True when every parameter is finite: one fused abs-max per device (inf and NaN
    propagate into a tensor's abs-max), instead of one check per tensor."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for p in model.parameters():
        if p.numel():
            by_device.setdefault(p.device, []).append(p.detach())
    for ps in by_device.values():
        if not bool(torch.isfinite(torch.stack(torch._foreach_norm(ps, float("inf")))).all()):
            return False
    return True


class Snapshot:
    """A copy of a model's and an optimizer's state, to roll back to."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.optim_state = copy.deepcopy(optimizer.state_dict())

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        model.load_state_dict(self.model_state)
        optimizer.load_state_dict(copy.deepcopy(self.optim_state))


def guarded_step(
    loss: torch.Tensor,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    params: list[torch.Tensor],
    max_grad_norm: float,
    snapshot: Snapshot,
    par: Parallel | None = None,
    share: float = 1.0,
    clip_apart: list[list[torch.Tensor]] | None = None,
) -> torch.Tensor | None:
    """Backward, clip, and step, unless something is not finite.

    Returns the pre-clip gradient norm, or ``None`` when the step was skipped: the loss or the
    gradients were not finite (no step taken), or the step left non-finite weights (model and
    optimizer restored from ``snapshot``). With ``par`` (several data-parallel processes) the
    gradients are combined with this process's ``share`` of the minibatch before clipping,
    and a step is skipped everywhere when it is not finite anywhere.

    ``clip_apart`` splits ``params`` into groups clipped each to ``max_grad_norm`` on its own
    (a policy and a critic with a transformer of its own: the value loss's gradient, often tens
    of times the policy's, would otherwise shrink the policy's step); the norm returned is the
    first group's.
    """
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if par is not None:
        par.reduce_gradients(params, share)
    groups = clip_apart or [params]
    norms = [torch.nn.utils.clip_grad_norm_(g, max_grad_norm) for g in groups if g]
    finite = step_is_finite(loss, torch.stack(norms).sum())  # any group's non-finite norm
    if par is not None:
        finite = par.all_true(finite, norms[0].device)
    if not finite:
        optimizer.zero_grad(set_to_none=True)
        return None
    optimizer.step()
    if not params_are_finite(model):
        snapshot.restore(model, optimizer)
        return None
    return norms[0]


# --------------------------------------------------------------------------- the envelope


def turn_ends(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: the last token of each run of trained tokens (where a turn's reward
    sits)."""
    m = mask.bool()
    after = torch.zeros_like(m)
    after[:, :-1] = m[:, 1:]
    return m & ~after


def clip_whiten_rewards(
    rewards: torch.Tensor,
    where: torch.Tensor,
    clip: float = 3.0,
    par: Parallel | None = None,
    eps: float = 1e-8,
) -> tuple[torch.Tensor, float]:
    """Clip the rewards at ``where`` to ``mean ± clip·std`` of the batch, then divide by std.

    The mean is not subtracted: a turn that earned nothing still earns nothing (a shifted
    reward would charge or pay every turn, and so every extra turn). Statistics are over the
    ``where`` positions of the global batch (``par``).

    Returns:
        ``(rewards', fraction of where-positions clipped)``; positions outside ``where`` are
        returned unchanged.
    """
    m = where.to(rewards.dtype)
    stats = torch.stack([(rewards * m).sum(), (rewards * rewards * m).sum(), m.sum()])
    if par is not None and par.enabled:
        stats = par.sum(stats)
    n = stats[2].clamp(min=1.0)
    mean = stats[0] / n
    std = (stats[1] / n - mean * mean).clamp(min=0.0).add(eps).sqrt()
    clipped = rewards.clamp(mean - clip * std, mean + clip * std)
    frac = float(((clipped != rewards) & where.bool()).sum()) / float(n)
    return torch.where(where.bool(), clipped / std, rewards), frac


class AdaptiveKL:
    """The proportional KL controller of Ziegler et al. (2019): after each batch,

    ``beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon)``

    with ``n`` the episodes in the batch: beta rises while the policy drifts further from the
    reference than ``target`` and falls while it stays closer.
    """

    def __init__(self, init: float, target: float, horizon: float) -> None:
        if init <= 0 or target <= 0 or horizon <= 0:
            raise ValueError("AdaptiveKL: init, target and horizon must be > 0")
        self.value, self.target, self.horizon = float(init), float(target), float(horizon)

    def update(self, kl: float, n: int) -> float:
        """Move beta after a batch of ``n`` episodes whose mean KL was ``kl``; returns beta."""
        if math.isfinite(kl):
            error = min(max(kl / self.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * n / self.horizon
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state.get("value", self.value))


def autocast(device: torch.device, precision: str):
    """The envelope's precision option for a forward pass: bf16 autocast, or nothing (fp32)."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

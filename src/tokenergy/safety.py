"""Numerical safety for every trainer: skip non-finite steps, roll back to the last good weights.

A trainer takes a :class:`Snapshot` of the model and optimizer at the start of each
iteration (the last state known to be good). Before an optimizer step it asks
:func:`step_is_finite` about the loss and the gradient norm: a non-finite one skips the step
(counted in ``train/skipped_steps``). After a step, :func:`params_are_finite` catches weights
that a finite but huge update pushed to inf/NaN; then the snapshot is restored.
"""

from __future__ import annotations

import copy

import torch

from tokenergy.distributed import Parallel

__all__ = ["Snapshot", "guarded_step", "params_are_finite", "step_is_finite"]


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
) -> torch.Tensor | None:
    """Backward, clip, and step, unless something is not finite.

    Returns the pre-clip gradient norm, or ``None`` when the step was skipped: the loss or the
    gradients were not finite (no step taken), or the step left non-finite weights (model and
    optimizer restored from ``snapshot``). With ``par`` (several data-parallel processes) the
    gradients are combined with this process's ``share`` of the minibatch before clipping,
    and a step is skipped everywhere when it is not finite anywhere.
    """
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if par is not None:
        par.reduce_gradients(params, share)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    finite = step_is_finite(loss, grad_norm)
    if par is not None:
        finite = par.all_true(finite, grad_norm.device)
    if not finite:
        optimizer.zero_grad(set_to_none=True)
        return None
    optimizer.step()
    if not params_are_finite(model):
        snapshot.restore(model, optimizer)
        return None
    return grad_norm

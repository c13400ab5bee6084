"""ActFocus and the other token weightings inside TRL's ``GRPOTrainer``.

TRL users keep TRL's generation (vLLM included), reward functions, and distributed stack;
:class:`ActFocusGRPOTrainer` only changes which completion tokens carry the gradient. It is a
``trl.GRPOTrainer`` whose loss multiplies each token's clipped surrogate by a weight from
:data:`tokenergy.energy.TOKEN_WEIGHTINGS`. TRL's clipped term is
``-min(r·A, clip(r)·A)``; for a weight ``w >= 0`` that is ``w`` times the same term with ``A``
replaced by ``w·A``, so the weights enter as per-token advantages (a ``[B, T]`` advantage
tensor is part of TRL's loss contract) and every loss type, clipping rule, KL term and
normaliser of TRL stays as it is.

Roles come from the completion's tags (``<think>``, ``</think>``, ``<answer>``, ``</answer>``),
which must be single tokens of the tokenizer (tokenergy's own tokenizer has them;
:func:`tokenergy.models.pretrained.add_tag_tokens` adds them to any other). The ActFocus
softmax runs over the action tokens of the micro-batch a process computes its loss on.

Requires ``pip install 'tokenergy[trl]'`` (``trl==1.16.0``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

try:
    from trl import GRPOTrainer
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("tokenergy.integrations.trl needs TRL: pip install 'tokenergy[trl]'") from err

from tokenergy.energy import TOKEN_WEIGHTINGS, shuffle_within_roles
from tokenergy.rollout import assign_roles, tag_ids_of
from tokenergy.types import Role

__all__ = ["ActFocusGRPOTrainer", "completion_roles"]

EnergyFn = Callable[[dict[str, Any]], torch.Tensor]


def completion_roles(completion_ids: torch.Tensor, tokenizer) -> torch.Tensor:
    """``[B, T]`` :class:`~tokenergy.types.Role` values of completion tokens, read from tags."""
    tags = tag_ids_of(tokenizer)
    unk = tokenizer.unk_token_id
    missing = [
        t for t in ("<think>", "</think>", "<answer>", "</answer>") if tags[t] in (None, unk)
    ]
    if missing:
        raise ValueError(
            f"the tokenizer has no single token for {', '.join(missing)}; add them with "
            "tokenergy.models.pretrained.add_tag_tokens(model, tokenizer)"
        )
    rows = [assign_roles(row, tags) for row in completion_ids.tolist()]
    return torch.tensor(rows, dtype=torch.long, device=completion_ids.device)


class ActFocusGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with per-token loss weights (ActFocus by default).

    Args (besides ``GRPOTrainer``'s):
        weighting: a :data:`~tokenergy.energy.TOKEN_WEIGHTINGS` name: ``actfocus`` (the
            paper's), ``actfocus_softmax`` (ours), ``bottleneck``, ``top_entropy`` or ``none``.
        energy: ``ref_surprisal`` (``-log π_ref``; needs ``GRPOConfig(beta > 0)``, which makes
            TRL compute the reference log-probs), ``surprisal`` (``-log π_old``; one extra
            forward without gradient when TRL did not keep the old log-probs), ``entropy``
            (the same forward), or a function ``inputs -> [B, T]`` energy. TRL keeps only the
            reference's log-prob of the sampled token, not the logsumexp of its logits, so
            the paper's reference free energy needs a function here.
        alpha, action_beta, format_weight: ActFocus (see
            :func:`tokenergy.energy.actfocus_weights`; ``action_beta`` is the paper's ``beta``,
            named apart from TRL's own ``beta``, its KL coefficient).
        lam, tau: ``actfocus_softmax`` (see :func:`tokenergy.energy.actfocus_softmax_weights`).
        threshold_std, weight_scale, smooth: the ``bottleneck`` weighting.
        top_rho: the ``top_entropy`` weighting.
        shuffle: the control, weights permuted among tokens of one role.
    """

    def __init__(
        self,
        *args: Any,
        weighting: str = "actfocus",
        energy: str | EnergyFn = "ref_surprisal",
        alpha: float = 0.1,
        action_beta: float = 0.5,
        lam: float = 0.5,
        tau: float = 1.0,
        format_weight: float = 1.0,
        threshold_std: float = 1.5,
        weight_scale: float = 2.0,
        smooth: bool = False,
        top_rho: float = 0.2,
        shuffle: bool = False,
        **kwargs: Any,
    ) -> None:
        if weighting not in TOKEN_WEIGHTINGS:
            raise ValueError(TOKEN_WEIGHTINGS.unknown_message(weighting))
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {lam}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if action_beta < 0.0:
            raise ValueError(f"action_beta must be >= 0, got {action_beta}")
        if not callable(energy) and energy not in ("ref_surprisal", "surprisal", "entropy"):
            raise ValueError(
                f"energy must be ref_surprisal, surprisal, entropy or a function, got {energy!r}"
            )
        super().__init__(*args, **kwargs)
        if energy == "ref_surprisal" and self.beta == 0.0:
            raise ValueError(
                "energy='ref_surprisal' reads TRL's reference log-probs, which it computes only "
                "when GRPOConfig(beta > 0); set beta or choose energy='surprisal'"
            )
        self.weighting = weighting
        self.energy = energy
        self.weight_cfg = SimpleNamespace(
            alpha=alpha, beta=action_beta, lam=lam, tau=tau, format_weight=format_weight,
            threshold_std=threshold_std, weight_scale=weight_scale, smooth=smooth,
            top_rho=top_rho,
        )  # fmt: skip
        self.shuffle = shuffle
        self._shuffle_gen = torch.Generator().manual_seed(self.args.seed)

    @torch.no_grad()
    def token_energy(self, model, inputs: dict[str, Any]) -> torch.Tensor:
        """``[B, T]`` energy of the completion tokens."""
        if callable(self.energy):
            return self.energy(inputs).detach()
        if self.energy == "ref_surprisal":
            return -inputs["ref_per_token_logps"].detach()
        if self.energy == "surprisal" and inputs.get("old_per_token_logps") is not None:
            return -inputs["old_per_token_logps"].detach()
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            completion_ids.size(1),
            compute_entropy=self.energy == "entropy",
        )
        return entropies if self.energy == "entropy" else -logps

    def token_weights(self, model, inputs: dict[str, Any]) -> torch.Tensor:
        """``[B, T]`` loss weights of the completion tokens (0 outside the completion mask)."""
        roles = completion_roles(inputs["completion_ids"], self.processing_class)
        mask = inputs["completion_mask"].bool()
        if "tool_mask" in inputs:
            mask = mask & inputs["tool_mask"].bool()
        energy = self.token_energy(model, inputs).float()
        w = TOKEN_WEIGHTINGS.get(self.weighting)(energy, roles, mask, self.weight_cfg)
        if self.shuffle:
            w = shuffle_within_roles(w.cpu(), roles.cpu(), mask.cpu(), self._shuffle_gen)
        w = w.to(mask.device)
        mode = "train" if self.model.training else "eval"
        action = (roles == int(Role.ACTION)) & mask
        total = (w * mask).sum().clamp(min=1e-12)
        self._metrics[mode]["weights/action_share"].append(float((w * action).sum() / total))
        self._metrics[mode]["weights/max"].append(float((w * mask).max()) if mask.any() else 0.0)
        return w

    def _compute_loss(self, model, inputs):
        weights = self.token_weights(model, inputs)
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        return super()._compute_loss(model, {**inputs, "advantages": advantages * weights})

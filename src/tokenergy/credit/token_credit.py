"""Token-level credit for LM runs: the energy, and what the run does with it.

:class:`TokenCredit` holds what outlives one iteration (the learned energy model, the β
controller, the schedules) and turns a scored batch into

- a per-token energy ``E [B, T]`` (:data:`~tokenergy.energy.TOKEN_ENERGIES`),
- shaped rewards ``r_t - reward_beta * standardized(E_t)`` (before the advantages),
- per-token loss weights (:data:`~tokenergy.energy.TOKEN_WEIGHTINGS`, optionally shuffled
  within roles as the control),
- the prior term's current ``β`` (the loss itself is computed in the update),

and the ``energy/*`` and ``weights/*`` metrics. Before ``warmup_iters`` the energy is
computed and logged but changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from tokenergy.config import LMRunConfig
from tokenergy.energy import (
    TOKEN_ENERGIES,
    TOKEN_WEIGHTINGS,
    TokenEnergyInputs,
    shaped_rewards,
    shuffle_within_roles,
)
from tokenergy.ops import masked_mean, masked_var
from tokenergy.types import Role

__all__ = ["TokenCredit"]

_ROLES = {"reasoning": Role.REASONING, "action": Role.ACTION, "format": Role.FORMAT}


def _linear(start: float, final: float | None, frac: float) -> float:
    return start if final is None else start + (final - start) * min(max(frac, 0.0), 1.0)


class TokenCredit:
    """Energy, shaping and weights of one LM run (see the module docstring)."""

    def __init__(self, cfg: LMRunConfig, vocab_size: int) -> None:
        self.cfg = cfg
        self.e = cfg.energy
        self.source = TOKEN_ENERGIES.get(self.e.source)
        self.weighting = TOKEN_WEIGHTINGS.get(self.e.weighting)
        self.reward_beta = self.e.reward_beta
        self.prior_beta = self.e.prior_beta
        self.best_success = -float("inf")
        self.stalled = 0
        # The run keeps a frozen reference for its KL penalty or for the energy's sake.
        self.has_reference = cfg.algo.kl_coef > 0 or self.e.needs_reference
        self.learned: Any = None
        if self.e.source == "discriminator":
            from tokenergy.credit.energy_models import Discriminator

            self.learned = Discriminator(vocab_size, window=self.e.window, seed=cfg.seed)
        elif self.e.source == "uncertainty":
            from tokenergy.credit.energy_models import UncertaintyEnsemble

            self.learned = UncertaintyEnsemble(vocab_size, window=self.e.window, seed=cfg.seed)

    # ---- schedules --------------------------------------------------------------------------

    def on(self, iteration: int) -> bool:
        """Whether the energy changes training at this (0-based) RL iteration."""
        return self.e.active and iteration >= self.e.warmup_iters

    def _frac(self, iteration: int) -> float:
        span = self.cfg.algo.iterations - self.e.warmup_iters
        return (iteration - self.e.warmup_iters) / max(span - 1, 1)

    def params(self, iteration: int):
        """The energy config with ``lam`` and ``weight_scale`` at their scheduled values."""
        frac = self._frac(iteration)
        return dataclasses.replace(
            self.e,
            lam=_linear(self.e.lam, self.e.lam_final, frac),
            weight_scale=_linear(self.e.weight_scale, self.e.weight_scale_final, frac),
        )

    def after_eval(self, success: float) -> None:
        """The β controller: halve both βs after ``beta_patience`` evaluations without a new
        best held-out success."""
        if success > self.best_success:
            self.best_success, self.stalled = success, 0
            return
        self.stalled += 1
        if self.e.beta_patience and self.stalled >= self.e.beta_patience:
            self.reward_beta *= 0.5
            self.prior_beta *= 0.5
            self.stalled = 0

    # ---- per batch --------------------------------------------------------------------------

    @property
    def needs_advantages(self) -> bool:
        return self.e.source == "advantage"

    def energy(self, traj, sc, advantages: torch.Tensor | None = None) -> torch.Tensor:
        inputs = TokenEnergyInputs(
            tokens=traj.tokens,
            roles=traj.roles,
            mask=traj.mask,
            logprobs=sc.logprobs,
            ref_logprobs=sc.ref_logprobs if self.has_reference else None,
            entropy=sc.entropy,
            free_energy=sc.free_energy,
            kl_ref=sc.kl_ref,
            ref_free_energy=sc.ref_free_energy,
            ref_entropy=sc.ref_entropy,
            advantages=advantages,
            learned=self.learned,
        )
        return self.source(inputs, self.e).float() * traj.mask.float()

    def shape(self, rewards: torch.Tensor, energy: torch.Tensor, traj, iteration: int):
        if not self.on(iteration) or self.reward_beta <= 0:
            return rewards
        return shaped_rewards(rewards, energy, traj.roles, traj.mask, self.reward_beta)

    def weights(
        self,
        energy: torch.Tensor,
        traj,
        iteration: int,
        generator: torch.Generator,
        reduce_sum=None,
    ) -> torch.Tensor | None:
        """Per-token loss weights, or ``None`` (plain token-mean) when none apply now;
        ``reduce_sum`` (data parallelism) sums the weighting's batch statistics over the
        processes."""
        if not self.on(iteration) or self.e.weighting == "none":
            return None
        params = self.params(iteration)
        extra = {} if reduce_sum is None else {"reduce_sum": reduce_sum}  # data-parallel only
        w = self.weighting(energy, traj.roles, traj.mask, params, **extra)
        if self.e.shuffle:
            w = shuffle_within_roles(w, traj.roles, traj.mask, generator)
        return w

    def prior_coef(self, iteration: int) -> float:
        return self.prior_beta if self.on(iteration) else 0.0

    def update_learned(self, traj, solver_traj=None) -> None:
        """Train the learned energy model (if any) on this batch, after it scored it."""
        if self.e.source == "discriminator":
            self.learned.update(solver_traj.tokens, solver_traj.mask, traj.tokens, traj.mask)
        elif self.e.source == "uncertainty":
            self.learned.update(traj.tokens, traj.roles, traj.mask, traj.attention_mask)

    # ---- metrics and state ------------------------------------------------------------------

    def metrics(self, energy: torch.Tensor, weights: torch.Tensor | None, traj, iteration: int):
        mask = traj.mask
        w = mask.float() if weights is None else weights
        row: dict[str, float] = {
            "energy/mean": float(masked_mean(energy, mask)),
            "energy/std": float(masked_var(energy, mask).sqrt()),
            "energy/active": float(self.on(iteration)),
            "weights/action_share": float(
                (w * ((traj.roles == int(Role.ACTION)) & mask)).sum() / w.sum().clamp(min=1e-12)
            ),
            "weights/max": float((w * mask).max()) if mask.any() else 0.0,
        }
        for name, role in _ROLES.items():
            rm = mask & (traj.roles == int(role))
            row[f"energy/{name}"] = float(masked_mean(energy, rm))
            row[f"weights/{name}"] = float(masked_mean(w, rm))
        if self.e.weighting == "actfocus_softmax":
            row["energy/lam"] = self.params(iteration).lam
        if self.e.weighting == "bottleneck":
            row["energy/weight_scale"] = self.params(iteration).weight_scale
        if self.e.reward_beta > 0:
            row["energy/reward_beta"] = self.reward_beta
        if self.e.prior_beta > 0:
            row["energy/prior_beta"] = self.prior_beta
        if self.e.source == "discriminator":
            row["energy/discriminator_accuracy"] = self.learned.last_accuracy
        if self.e.source == "uncertainty":
            row["energy/ensemble_loss"] = self.learned.last_loss
        return row

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "reward_beta": self.reward_beta,
            "prior_beta": self.prior_beta,
            "best_success": self.best_success,
            "stalled": self.stalled,
        }
        if self.learned is not None:
            nets = getattr(self.learned, "net", None) or self.learned.nets
            state["learned"] = nets.state_dict()
            state["learned_opt"] = self.learned.opt.state_dict()
            if hasattr(self.learned, "gen"):
                state["learned_gen"] = self.learned.gen.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reward_beta = state["reward_beta"]
        self.prior_beta = state["prior_beta"]
        self.best_success = state["best_success"]
        self.stalled = state["stalled"]
        if self.learned is not None:
            nets = getattr(self.learned, "net", None) or self.learned.nets
            nets.load_state_dict(state["learned"])
            self.learned.opt.load_state_dict(state["learned_opt"])
            if "learned_gen" in state:
                self.learned.gen.set_state(state["learned_gen"])


def solver_batch(cfg: LMRunConfig, agent, seeds: list[int]):
    """The scripted solver's episodes on ``seeds`` (the discriminator's positive examples)."""
    from tokenergy.rollout.episodes import noisy_solver, run_episodes

    return run_episodes(agent, cfg, seeds, turn_fn=noisy_solver(0.0, np.random.default_rng(0)))

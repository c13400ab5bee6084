"""The update stage of the LM trainers: epochs of minibatch steps on a scored, credited batch.

:func:`update` runs ``algo.epochs`` passes over the batch in ``algo.minibatches`` minibatches of
whole sequences, one optimizer step each on :func:`minibatch_loss` (the clipped policy loss with
the credit's token weights, the value loss, the entropy bonus, the KL and prior terms, the SFT
anchor), guarded by the envelope (the ratio cap; a non-finite step skipped and rolled back).
Both LM trainers call it: :func:`tokenergy.algos.lm.train_lm` on episodes of text envs and the
pipeline's PPO (:mod:`tokenergy.algos.pipeline`) on continuations scored by a reward model. What
it reads from the trainer is the :class:`Learner` protocol.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from tokenergy.algos.minibatches import RATIO_CAPPED, SKIPPED, minibatch_epochs
from tokenergy.config.lm import AlgoConfig
from tokenergy.distributed import Parallel
from tokenergy.energy import energy_prior_kl
from tokenergy.losses import kl_estimate, ppo_policy_loss, value_loss
from tokenergy.models.lm import AgentOutput, causal_only
from tokenergy.ops import masked_mean
from tokenergy.rollout import Scored, Trajectories, token_logprobs
from tokenergy.safety import Snapshot, autocast, guarded_step

__all__ = [
    "Credit",
    "Learner",
    "UpdateStats",
    "forward_by_length",
    "minibatch_loss",
    "scheduled",
    "update",
    "update_optimizer",
]


class Learner(Protocol):
    """What :func:`update` reads from a trainer, and the two counters it adds to.

    ``algo`` holds the update's settings (epochs, minibatches, clip ranges and their
    schedules, learning rates, coefficients, the ratio cap, precision); ``params`` are the
    optimizer's parameters (policy, then value head: its two parameter groups);
    ``clip_apart``, when given, lists parameter groups whose gradients are clipped apart (a
    separate critic); ``rollback`` false lets a non-finite step through (the envelope off)."""

    agent: torch.nn.Module
    ref: torch.nn.Module | None
    opt: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    clip_apart: list[list[torch.nn.Parameter]] | None
    gen: torch.Generator
    par: Parallel
    device: torch.device
    target_head: torch.nn.Module | None
    anchor: Any
    reuse_logprobs: bool
    ratio_skips: int
    skipped_steps: int

    @property
    def algo(self) -> AlgoConfig: ...

    @property
    def prior_tau(self) -> float: ...

    @property
    def rollback(self) -> bool: ...

    @property
    def trains_value(self) -> bool: ...


def update_optimizer(
    agent: torch.nn.Module, lr: float, value_lr: float
) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """AdamW with the two parameter groups :func:`update` sets the rates of: the policy's
    trainable weights at ``lr``, then the value head (or separate critic) at ``value_lr``.
    Returns the optimizer and the two groups' parameters."""
    policy_params = [p for p in agent.policy.parameters() if p.requires_grad]
    head_params = list(agent.value_head.parameters())
    opt = torch.optim.AdamW(
        [{"params": policy_params, "lr": lr}, {"params": head_params, "lr": value_lr}],
        weight_decay=0.0,
    )
    return opt, policy_params, head_params


def scheduled(start: float, final: float | None, iteration: int, n_iters: int) -> float:
    """``start`` moved linearly to ``final`` (when given) over the RL iterations."""
    if final is None or n_iters <= 1:
        return start
    return start + (final - start) * iteration / (n_iters - 1)


def forward_by_length(
    agent: torch.nn.Module,
    tokens: torch.Tensor,
    attention_mask: torch.Tensor,
    lengths: torch.Tensor,
    with_values: bool = True,
    value_grad_to_policy: bool = True,
    rows_per_chunk: int = 8,
) -> AgentOutput:
    """The agent's forward over a right-padded batch, computed in chunks of rows of similar
    length, each cut to its longest row; the outputs are put back in the batch's order and
    shape, zero past each chunk's longest row.

    Attention costs the square of the padded length, so a minibatch whose rows run from one
    turn to five spends most of its time on padding when computed as one block. Every row's
    logits and values are the ones the whole-batch forward gives (padding is masked there), and
    the gradient flows through each chunk's own forward, so a loss on the result is the same.

    Args:
        tokens, attention_mask: ``(B, T)``.
        lengths: ``(B,)`` real tokens of each row.
    """
    B, T = tokens.shape
    if rows_per_chunk >= B:
        return agent(tokens, attention_mask, with_values, value_grad_to_policy=value_grad_to_policy)
    order = torch.argsort(lengths.cpu(), stable=True)
    logits, values = [], []
    for start in range(0, B, rows_per_chunk):
        rows = order[start : start + rows_per_chunk].to(tokens.device)
        n = int(lengths[rows].max())
        out = agent(tokens[rows, :n], attention_mask[rows, :n], with_values,
                    value_grad_to_policy=value_grad_to_policy)  # fmt: skip
        logits.append(torch.nn.functional.pad(out.logits, (0, 0, 0, T - n)))
        values.append(torch.nn.functional.pad(out.values, (0, T - n)))
    back = torch.argsort(order).to(tokens.device)  # row i of the batch is row back[i] here
    return AgentOutput(torch.cat(logits)[back], torch.cat(values)[back])


@dataclass
class Credit:
    """What :func:`assign_credit` gives the update: per-token advantages (``(B, T)``, and the
    whitened ones the loss reads), value targets, the energy and the loss weights (or None),
    and this iteration's coefficients."""

    advantages: torch.Tensor
    adv_loss: torch.Tensor
    returns: torch.Tensor | None
    energy: torch.Tensor | None
    weights: torch.Tensor | None
    kl_coef: float
    prior_coef: float
    envelope_row: dict[str, float]


@dataclass
class UpdateStats:
    """The update's means over its minibatch steps and this iteration's schedule."""

    means: defaultdict
    n_updates: int
    critic_only: bool
    clip_eps: float
    ent_coef: float
    sft_coef: float


def update(t: Learner, traj: Trajectories, sc: Scored, cr: Credit, iteration: int) -> UpdateStats:
    """Stage 4: ``algo.epochs`` passes over the batch in ``algo.minibatches`` minibatches of
    whole episodes, one guarded optimizer step each (:func:`minibatch_loss`); a step over the
    ratio cap or with a non-finite gradient is skipped (and rolled back). During
    ``algo.critic_warmup_iters`` only the value head learns."""
    a, n_iters = t.algo, t.algo.iterations
    critic_only = iteration < a.critic_warmup_iters  # the value head learns, the policy waits
    clip_eps = scheduled(a.clip_eps, a.clip_eps_final, iteration, n_iters)
    ent_coef = scheduled(a.ent_coef, a.ent_coef_final, iteration, n_iters)
    sft_coef = scheduled(a.sft_coef, a.sft_coef_final, iteration, n_iters)
    coefs = {"clip_eps": clip_eps, "ent_coef": ent_coef, "sft_coef": sft_coef}
    lr_share = scheduled(a.lr, a.lr_final, iteration, n_iters) / a.lr
    for group, base_lr in zip(t.opt.param_groups, (a.lr, a.value_lr), strict=True):
        group["lr"] = base_lr * lr_share  # set from the iteration, so a resumed run agrees
    t.agent.train()
    snapshot = Snapshot(t.agent, t.opt)  # the last good state, for a rollback

    def step(idx: torch.Tensor) -> dict | str:
        out = minibatch_loss(t, traj, sc, cr, idx, critic_only, coefs)
        if out is None:  # over the ratio cap
            return RATIO_CAPPED
        loss, metrics, mb_mask = out
        if not t.rollback:  # the envelope off: a non-finite step goes through
            t.opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(t.params, a.max_grad_norm)
            t.opt.step()
            return {**metrics, "grad_norm": grad_norm}
        grad_norm = guarded_step(
            loss, t.agent, t.opt, t.params, a.max_grad_norm, snapshot, par=t.par,
            share=t.par.token_share(mb_mask), clip_apart=t.clip_apart,
        )  # fmt: skip
        if grad_norm is None:
            return SKIPPED
        return {**metrics, "grad_norm": grad_norm}

    stats = minibatch_epochs(traj.batch_size, a.epochs, a.minibatches, t.gen, step)
    t.ratio_skips += stats.ratio_capped
    t.skipped_steps += stats.skipped
    if t.target_head is not None:  # soft update toward the value head just trained
        with torch.no_grad():
            for tp, p in zip(
                t.target_head.parameters(), t.agent.value_head.parameters(), strict=True
            ):
                tp.lerp_(p, a.value_target_tau)
    return UpdateStats(stats.means(), stats.updates, critic_only, clip_eps, ent_coef, sft_coef)


def minibatch_loss(
    t: Learner,
    traj: Trajectories,
    sc: Scored,
    cr: Credit,
    idx: torch.Tensor,
    critic_only: bool,
    coefs: dict[str, float],
) -> tuple[torch.Tensor, dict[str, Any], torch.Tensor] | None:
    """The loss of the minibatch ``idx`` (the clipped policy loss with the credit's weights,
    the value loss, the entropy bonus, the KL and prior terms, the SFT anchor), its metrics and
    mask; None when its mean ratio is over ``algo.ratio_cap``."""
    a, device, par = t.algo, t.device, t.par
    length = int(traj.last_index[idx].max()) + 1
    cols = slice(0, length)
    tokens = traj.tokens[idx, cols].to(device)
    mb_mask = traj.mask[idx, cols].to(device)
    with autocast(device, a.precision):
        out = forward_by_length(
            t.agent,
            tokens,
            traj.attention_mask[idx, cols].to(device),
            traj.last_index[idx] + 1,
            t.trains_value,
            value_grad_to_policy=not critic_only,
        )
    new_logprobs = token_logprobs(out.logits, tokens)
    if t.reuse_logprobs:  # the only update, over the whole batch: the ratio is 1
        with torch.no_grad():
            sc.logprobs[idx, cols] = new_logprobs.float().cpu()
            logp = torch.log_softmax(out.logits[:, :-1].float(), -1)
            sc.entropy[idx, 1:length] = -(logp.exp() * logp).sum(-1).cpu()
    old_logprobs = sc.logprobs[idx, cols].to(device)
    if a.ratio_cap is not None and not critic_only:
        with torch.no_grad():
            ratio_mean = masked_mean((new_logprobs - old_logprobs).exp(), mb_mask)
            ratio_mean = par.sum(ratio_mean * par.token_share(mb_mask))
        if not bool(ratio_mean <= a.ratio_cap):  # NaN counts as over the cap
            return None
    mb_weights = None if cr.weights is None else cr.weights[idx, cols].to(device)
    loss, metrics = ppo_policy_loss(
        new_logprobs,
        old_logprobs,
        cr.adv_loss[idx, cols].to(device),
        mb_mask,
        coefs["clip_eps"],
        weights=mb_weights,
        clip_eps_high=a.clip_eps_high,
        normalize=a.loss_normalize,
    )
    if par.enabled and mb_weights is not None and a.loss_normalize == "weights":
        loss = loss * par.weight_rescale(mb_mask, mb_weights)  # the global weights' sum
    metrics = dict(metrics)
    if t.trains_value:
        v = out.values
        new_values = torch.cat([v.new_zeros(v.shape[0], 1), v[:, :-1]], 1)
        v_loss, v_m = value_loss(
            new_values,
            sc.values[idx, cols].to(device),
            cr.returns[idx, cols].to(device),
            mb_mask,
            a.value_clip,
        )
        loss = loss + a.vf_coef * v_loss
        metrics.update(v_m)
    if coefs["ent_coef"] > 0:
        logp = torch.log_softmax(out.logits[:, :-1].float(), -1)
        ent = -(logp.exp() * logp).sum(-1)
        ent_mean = masked_mean(torch.cat([ent.new_zeros(ent.shape[0], 1), ent], 1), mb_mask)
        loss = loss - coefs["ent_coef"] * ent_mean
        metrics["entropy_bonus"] = ent_mean.detach()
    if cr.kl_coef > 0 and a.kl_in == "loss":
        ref_lp = sc.ref_logprobs[idx, cols].to(device)
        kl = masked_mean(kl_estimate(new_logprobs, ref_lp, a.kl_kind), mb_mask)
        loss = loss + cr.kl_coef * kl
        metrics["kl_loss"] = kl.detach()
    if cr.prior_coef > 0:
        # pi_E ∝ exp(-E_vocab / tau) with E_vocab = -log pi_ref: a softened reference.
        with torch.no_grad():
            attn = traj.attention_mask[idx, cols].to(device)
            ref_logits = t.ref(
                input_ids=tokens, attention_mask=causal_only(attn), use_cache=False
            ).logits[:, :-1]
        prior = energy_prior_kl(
            out.logits[:, :-1],
            -torch.log_softmax(ref_logits.float(), -1),
            mb_mask[:, 1:],
            t.prior_tau,
        )
        loss = loss + cr.prior_coef * prior
        metrics["prior_kl"] = prior.detach()
    if t.anchor is not None and coefs["sft_coef"] > 0 and not critic_only:
        with autocast(device, a.precision):
            anchor_nll = t.anchor.loss(t.agent, device, t.gen)
        loss = loss + coefs["sft_coef"] * anchor_nll
        metrics["sft_anchor"] = anchor_nll.detach()
    if critic_only:
        loss = a.vf_coef * v_loss
    return loss, metrics, mb_mask

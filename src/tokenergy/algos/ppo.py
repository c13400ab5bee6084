"""PPO for discrete-action, vector-observation Gymnasium envs, with energy-weighted losses.

The loop reads top to bottom: rollout → bootstrap values → GAE → energy and weights → epochs
of minibatch updates → log (:func:`train_ppo`, each stage a function). Simplifications, stated once: a synchronous batch of envs in one
process; advantages whitened over the whole batch (not per minibatch) so that the energy and
its z-scores are computed once per batch on the same scale; one shared Adam for actor and
critic.

Energy weighting (seed 001): each step gets an energy ``E_t`` (by default
``sigmoid(-β Â_t)`` of the whitened advantage), z-scored over the batch; steps with
``z > threshold_std`` are bottlenecks and their policy-loss term is scaled by
``weight_scale``. The first ``warmup_frac`` of training is plain PPO, so the value function
(and with it the advantage energy) is reliable before weighting starts. The ``shuffle``
control permutes the same weights among steps.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tokenergy.advantages import gae, whiten
from tokenergy.algos.minibatches import SKIPPED, minibatch_epochs
from tokenergy.config import RunConfig
from tokenergy.energy import ENERGY_SOURCES, WEIGHTINGS, EnergyInputs, shuffled_weights
from tokenergy.envs import BatchedEnv
from tokenergy.losses import ppo_policy_loss, value_loss
from tokenergy.models import ActorCritic
from tokenergy.ops import masked_mean, masked_var
from tokenergy.runs import Run
from tokenergy.safety import Snapshot, guarded_step

__all__ = ["ProgressFn", "TrainResult", "resolve_device", "train_ppo", "weight_scale_at"]

# progress(iteration, num_iterations, global_step, metrics)
ProgressFn = Callable[[int, int, int, dict[str, float]], None]


@dataclass
class TrainResult:
    """What a finished run hands back (everything else is in the run folder)."""

    model: ActorCritic
    history: list[dict[str, float]]  # one row per iteration, as in metrics.jsonl
    run_dir: Path | None


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; an explicit ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(
            f"device {name!r} asked for, but torch sees no CUDA device; use --device cpu"
        )
    return torch.device(name)


def weight_scale_at(cfg: RunConfig, iteration: int) -> float | None:
    """The scheduled bottleneck weight at ``iteration`` (0-based); ``None`` during warm-up."""
    e = cfg.energy
    n = cfg.num_iterations
    start = int(e.warmup_frac * n)
    if iteration < start:
        return None
    if e.weight_scale_final is None or n - start <= 1:
        return e.weight_scale
    frac = (iteration - start) / (n - start - 1)
    return e.weight_scale + frac * (e.weight_scale_final - e.weight_scale)


def train_ppo(
    cfg: RunConfig,
    run: Run | None = None,
    progress: ProgressFn | None = None,
    resume: Path | None = None,
) -> TrainResult:
    """Train an MLP actor-critic with (energy-weighted) PPO as configured by ``cfg``.

    An iteration is :func:`collect_steps` (``num_steps`` of every env, no gradient) →
    :func:`assign_step_credit` (bootstrapped GAE, the energy and the loss weights) →
    :func:`update_policy` (epochs of minibatch steps) → :func:`step_metrics` → log and
    checkpoint.

    With ``resume`` (a checkpoint folder written by this function) the run continues from
    that checkpoint exactly: weights, optimizer, random generators, env states, the episode
    window and the counters come back, so on CPU the remaining iterations equal those of an
    uninterrupted run.
    """
    t = VectorTrainer.start(cfg, run, resume)
    n_iters = cfg.num_iterations
    for iteration in range(t.start_iteration, n_iters):
        if cfg.ppo.anneal_lr:
            t.optimizer.param_groups[0]["lr"] = cfg.ppo.lr * (1.0 - iteration / n_iters)
        t_iter = time.perf_counter()
        steps = collect_steps(t)
        cr = assign_step_credit(t, steps, iteration)
        means, n_updates = update_policy(t, steps, cr)
        row = step_metrics(t, iteration, steps, cr, means, n_updates)
        row["perf/sps"] = steps.actions.numel() / (time.perf_counter() - t_iter)
        row["perf/elapsed_s"] = time.perf_counter() - t.t_start
        t.history.append({"train/global_step": t.global_step, **row})
        if run is not None:
            run.log(t.global_step, row)
            every = cfg.log.checkpoint_every
            if (every and (iteration + 1) % every == 0) or iteration + 1 == n_iters:
                run.save_checkpoint(
                    t.model,
                    iteration + 1,
                    {"global_step": t.global_step},
                    t.state_dict(iteration + 1),
                )
        if progress is not None:
            progress(iteration + 1, n_iters, t.global_step, row)
    t.envs.close()
    return TrainResult(model=t.model, history=t.history, run_dir=run.path if run else None)


@dataclass
class VectorTrainer:
    """A vector PPO run between iterations: the model, its optimizer, the envs and their
    current observations, the random stream, the episode window and the counters."""

    cfg: RunConfig
    model: ActorCritic
    optimizer: torch.optim.Optimizer
    envs: BatchedEnv
    obs: torch.Tensor  # (B, obs_dim), the envs' current observations
    gen: torch.Generator  # sampling and minibatch order (CPU)
    episodes: deque  # the last log.episode_window finished episodes
    device: torch.device
    t_start: float
    start_iteration: int = 0
    global_step: int = 0
    skipped_steps: int = 0  # non-finite steps skipped (and rolled back), over the run
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def obs_dim(self) -> int:
        return self.obs.shape[1]

    @classmethod
    def start(cls, cfg: RunConfig, run: Run | None, resume: Path | None) -> VectorTrainer:
        """A fresh run (envs reset with the run's seed), or the one a checkpoint holds."""
        device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        gen = torch.Generator().manual_seed(cfg.seed)
        envs = BatchedEnv.make(cfg.env.id, cfg.env.num_envs, **cfg.env.kwargs)
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        num_actions = int(envs.single_action_space.n)
        model = ActorCritic(obs_dim, num_actions, cfg.model.hidden_sizes, cfg.model.activation)
        model = model.to(device)
        optimizer = torch.optim.Adam(list(model.parameters()), lr=cfg.ppo.lr, eps=1e-5)
        obs = torch.from_numpy(envs.reset(seed=cfg.seed)).reshape(cfg.env.num_envs, obs_dim)
        t = cls(cfg, model, optimizer, envs, obs, gen, deque(maxlen=cfg.log.episode_window),
                device, time.perf_counter())  # fmt: skip
        if resume is not None:
            t.restore(resume, run)
        return t

    def restore(self, resume: Path, run: Run | None) -> None:
        from tokenergy.runs import load_checkpoint, load_trainer_state, read_metrics

        tensors, _, _ = load_checkpoint(resume)
        self.model.load_state_dict(tensors)
        ts = load_trainer_state(resume)
        self.optimizer.load_state_dict(ts["optimizer"])
        self.gen.set_state(ts["generator"])
        torch.set_rng_state(ts["torch_rng"])
        self.envs.close()
        self.envs = pickle.loads(ts["envs"])
        self.obs = ts["obs"]
        self.episodes = deque(ts["episodes"], maxlen=self.cfg.log.episode_window)
        self.global_step, self.skipped_steps = ts["global_step"], ts["skipped_steps"]
        self.start_iteration = ts["iteration"]
        self.t_start -= ts["elapsed_s"]
        if run is not None:
            self.history = [r for r in read_metrics(run.path) if "train/iteration" in r]

    def state_dict(self, iteration: int) -> dict[str, Any]:
        return {
            "iteration": iteration,
            "optimizer": self.optimizer.state_dict(),
            "generator": self.gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "envs": pickle.dumps(self.envs),
            "obs": self.obs,
            "episodes": list(self.episodes),
            "global_step": self.global_step,
            "skipped_steps": self.skipped_steps,
            "elapsed_s": time.perf_counter() - self.t_start,
        }


@dataclass
class Steps:
    """``(B, T)`` buffers of one rollout: observations, their true successors, actions, the
    behaviour policy's log-probs, values and logits, rewards and episode ends."""

    obs: torch.Tensor
    next_obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    logits: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    new_episodes: int


@torch.no_grad()
def collect_steps(t: VectorTrainer) -> Steps:
    """Stage 1: ``ppo.num_steps`` steps of every env under the current policy (sampled with
    ``t.gen``); finished episodes join ``t.episodes``; ``t.obs`` and ``t.global_step`` move on."""
    B, T, obs_dim = t.cfg.env.num_envs, t.cfg.ppo.num_steps, t.obs_dim
    num_actions = int(t.envs.single_action_space.n)
    s = Steps(
        obs=torch.zeros(B, T, obs_dim),
        next_obs=torch.zeros(B, T, obs_dim),  # true successors, for bootstrapping
        actions=torch.zeros(B, T, dtype=torch.long),
        logprobs=torch.zeros(B, T),
        values=torch.zeros(B, T),
        logits=torch.zeros(B, T, num_actions),
        rewards=torch.zeros(B, T),
        terminated=torch.zeros(B, T, dtype=torch.bool),
        truncated=torch.zeros(B, T, dtype=torch.bool),
        new_episodes=0,
    )
    for i in range(T):
        logits, values = t.model(t.obs.to(t.device))
        logits, values = logits.cpu(), values.cpu()
        logp_all = torch.log_softmax(logits, dim=-1)  # (B, A)
        actions = torch.multinomial(logp_all.exp(), 1, generator=t.gen).squeeze(-1)  # (B,)
        step = t.envs.step(actions.numpy())
        s.obs[:, i] = t.obs
        s.actions[:, i] = actions
        s.logprobs[:, i] = logp_all.gather(-1, actions[:, None]).squeeze(-1)
        s.values[:, i] = values
        s.logits[:, i] = logits
        s.rewards[:, i] = torch.from_numpy(step.rewards)
        s.terminated[:, i] = torch.from_numpy(step.terminated)
        s.truncated[:, i] = torch.from_numpy(step.truncated)
        s.next_obs[:, i] = torch.from_numpy(step.final_obs).reshape(B, obs_dim)
        t.episodes.extend(step.episodes)
        s.new_episodes += len(step.episodes)
        t.obs = torch.from_numpy(step.obs).reshape(B, obs_dim)
    t.global_step += B * T
    return s


@dataclass
class StepCredit:
    """Advantages and value targets of a rollout, the energy and the loss weights."""

    advantages: torch.Tensor
    returns: torch.Tensor
    adv_for_loss: torch.Tensor
    energy: torch.Tensor
    weights: torch.Tensor
    bottleneck: torch.Tensor
    scale: float | None  # the scheduled weight scale; None during warm-up
    loss_weights: torch.Tensor | None  # the weights the loss reads (None: plain PPO)


@torch.no_grad()
def assign_step_credit(t: VectorTrainer, s: Steps, iteration: int) -> StepCredit:
    """Stage 2: GAE bootstrapped through the true successor of every step, then the energy of
    each step (``energy.source``) and its weights (``energy.weighting``, on its schedule)."""
    cfg = t.cfg
    next_values = t.model.value(s.next_obs.to(t.device)).cpu()  # (B, T)
    ends = s.terminated | s.truncated
    ends[:, -1] = True  # the rollout stops here: bootstrap from next_values
    advantages, returns = gae(
        s.rewards, s.values, next_values, s.terminated, ends, cfg.ppo.gamma, cfg.ppo.lam
    )
    mask = torch.ones_like(s.rewards, dtype=torch.bool)
    adv_for_loss = whiten(advantages, mask) if cfg.ppo.norm_adv else advantages
    inputs = EnergyInputs(
        mask=mask, logits=s.logits, tokens=s.actions, advantages=whiten(advantages, mask)
    )
    energy = ENERGY_SOURCES.get(cfg.energy.source)(inputs, cfg.energy)  # (B, T)
    scale = weight_scale_at(cfg, iteration)
    params = cfg.energy if scale is None else dataclasses.replace(cfg.energy, weight_scale=scale)
    weights, bottleneck = WEIGHTINGS.get(cfg.energy.weighting)(energy, mask, params)
    if cfg.energy.shuffle:
        weights = shuffled_weights(weights, mask, t.gen)
    active = scale is not None and cfg.energy.weighting != "none"
    return StepCredit(advantages, returns, adv_for_loss, energy, weights, bottleneck, scale,
                      weights if active else None)  # fmt: skip


def update_policy(t: VectorTrainer, s: Steps, cr: StepCredit) -> tuple[defaultdict, int]:
    """Stage 3: ``ppo.epochs`` passes over the flattened batch in ``ppo.minibatches``
    minibatches, one guarded Adam step each (clipped policy loss with the loss weights, value
    loss, entropy bonus); stops early past ``ppo.target_kl``. Returns the metrics' means over
    the steps taken and their number."""
    cfg, device = t.cfg, t.device
    n = s.actions.numel()
    weights = cr.loss_weights if cr.loss_weights is not None else torch.ones_like(s.rewards)
    flat = {
        "obs": s.obs.reshape(n, t.obs_dim),
        "actions": s.actions.reshape(-1),
        "logprobs": s.logprobs.reshape(-1),
        "values": s.values.reshape(-1),
        "advantages": cr.adv_for_loss.reshape(-1),
        "returns": cr.returns.reshape(-1),
        "weights": weights.reshape(-1),
    }
    flat = {k: v.to(device) for k, v in flat.items()}
    snapshot = Snapshot(t.model, t.optimizer)  # the last good state, for a rollback
    params = list(t.model.parameters())

    def step(idx: torch.Tensor) -> dict | str:
        idx = idx.to(device)
        logits, new_values = t.model(flat["obs"][idx])
        logp_all = torch.log_softmax(logits, dim=-1)
        new_logprobs = logp_all.gather(-1, flat["actions"][idx, None]).squeeze(-1)
        mb_mask = torch.ones_like(new_logprobs, dtype=torch.bool)
        pg_loss, pg_m = ppo_policy_loss(
            new_logprobs, flat["logprobs"][idx], flat["advantages"][idx], mb_mask,
            cfg.ppo.clip_eps,
            weights=flat["weights"][idx] if cr.loss_weights is not None else None,
            clip_eps_high=cfg.ppo.clip_eps_high,
        )  # fmt: skip
        v_loss, v_m = value_loss(new_values, flat["values"][idx], flat["returns"][idx],
                                 mb_mask, cfg.ppo.value_clip)  # fmt: skip
        ent = -(logp_all.exp() * logp_all).sum(-1).mean()
        loss = pg_loss + cfg.ppo.vf_coef * v_loss - cfg.ppo.ent_coef * ent
        grad_norm = guarded_step(
            loss, t.model, t.optimizer, params, cfg.ppo.max_grad_norm, snapshot
        )
        if grad_norm is None:
            return SKIPPED
        return {**pg_m, **v_m, "entropy": ent.detach(), "grad_norm": grad_norm}

    target_kl = cfg.ppo.target_kl
    stats = minibatch_epochs(
        n, cfg.ppo.epochs, cfg.ppo.minibatches, t.gen, step,
        stop=None if target_kl is None else lambda m: float(m["approx_kl"]) > target_kl,
    )  # fmt: skip
    t.skipped_steps += stats.skipped
    return stats.means(), stats.updates


def step_metrics(
    t: VectorTrainer, iteration: int, s: Steps, cr: StepCredit, means: defaultdict, n_updates: int
) -> dict[str, float]:
    """The iteration's row (docs/metrics.md), ``perf/*`` aside."""
    mask = torch.ones_like(s.rewards, dtype=torch.bool)
    var_y = cr.returns.var()
    explained_var = float("nan") if var_y == 0 else float(1 - (cr.returns - s.values).var() / var_y)
    row: dict[str, float] = {
        "train/iteration": iteration + 1,
        "train/lr": t.optimizer.param_groups[0]["lr"],
        "train/clipfrac": means["clipfrac"],
        "train/approx_kl": means["approx_kl"],
        "train/explained_var": explained_var,
        "train/grad_norm": means["grad_norm"],
        "train/ratio_max": means["ratio_max"],
        "train/updates": n_updates,
        "train/skipped_steps": t.skipped_steps,
        "train/weighting_active": float(cr.loss_weights is not None),
        "loss/policy": means["policy_loss"],
        "loss/value": means["value_loss"],
        "loss/entropy": means["entropy"],
        "loss/value_clipfrac": means["value_clipfrac"],
        "adv/mean": float(cr.advantages.mean()),
        "adv/std": float(cr.advantages.std()),
        "energy/mean": float(masked_mean(cr.energy, mask)),
        "energy/std": float(masked_var(cr.energy, mask).sqrt()),
        "weights/mean": float(cr.weights.mean()),
        "weights/max": float(cr.weights.max()),
        "weights/scale": float(cr.scale) if cr.scale is not None else 1.0,
        "weights/bottleneck_ratio": float(cr.bottleneck.float().mean()),
    }
    if t.episodes:
        row["rollout/return"] = float(np.mean([e.ret for e in t.episodes]))
        row["rollout/length"] = float(np.mean([e.length for e in t.episodes]))
        successes = [e.success for e in t.episodes if e.success is not None]
        if successes:
            row["rollout/success"] = float(np.mean(successes))
    row["rollout/episodes"] = s.new_episodes
    return row

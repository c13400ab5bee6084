"""PPO for discrete-action, vector-observation Gymnasium envs, with energy-weighted losses.

The loop reads top to bottom: rollout → bootstrap values → GAE → energy and weights → epochs
of minibatch updates → log. Simplifications, stated once: a synchronous batch of envs in one
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tokenergy.advantages import gae, whiten
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

    With ``resume`` (a checkpoint folder written by this function) the run continues from
    that checkpoint exactly: weights, optimizer, random generators, env states, the episode
    window and the counters come back, so on CPU the remaining iterations equal those of an
    uninterrupted run.
    """
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)  # sampling and minibatch order (CPU)
    envs = BatchedEnv.make(cfg.env.id, cfg.env.num_envs, **cfg.env.kwargs)
    obs_shape = envs.single_observation_space.shape
    obs_dim = int(np.prod(obs_shape))
    num_actions = int(envs.single_action_space.n)
    model = ActorCritic(obs_dim, num_actions, cfg.model.hidden_sizes, cfg.model.activation).to(
        device
    )
    model_params = list(model.parameters())
    optimizer = torch.optim.Adam(model_params, lr=cfg.ppo.lr, eps=1e-5)
    energy_source = ENERGY_SOURCES.get(cfg.energy.source)
    weighting = WEIGHTINGS.get(cfg.energy.weighting)

    B, T = cfg.env.num_envs, cfg.ppo.num_steps
    n_iters = cfg.num_iterations
    mb_size = (B * T) // cfg.ppo.minibatches
    episodes: deque = deque(maxlen=cfg.log.episode_window)
    history: list[dict[str, float]] = []
    global_step = 0
    obs = torch.from_numpy(envs.reset(seed=cfg.seed)).reshape(B, obs_dim)
    t_start = time.perf_counter()
    skipped_steps = 0  # non-finite steps skipped (and rolled back), over the run
    start_iteration = 0
    if resume is not None:
        from tokenergy.runs import load_checkpoint, load_trainer_state, read_metrics

        tensors, _, _ = load_checkpoint(resume)
        model.load_state_dict(tensors)
        ts = load_trainer_state(resume)
        optimizer.load_state_dict(ts["optimizer"])
        gen.set_state(ts["generator"])
        torch.set_rng_state(ts["torch_rng"])
        envs.close()
        envs = pickle.loads(ts["envs"])
        obs, episodes = ts["obs"], deque(ts["episodes"], maxlen=cfg.log.episode_window)
        global_step, skipped_steps = ts["global_step"], ts["skipped_steps"]
        start_iteration = ts["iteration"]
        t_start -= ts["elapsed_s"]
        if run is not None:
            history = [r for r in read_metrics(run.path) if "train/iteration" in r]

    for iteration in range(start_iteration, n_iters):
        if cfg.ppo.anneal_lr:
            optimizer.param_groups[0]["lr"] = cfg.ppo.lr * (1.0 - iteration / n_iters)
        t_iter = time.perf_counter()

        # ---- rollout (no gradient) -------------------------------------------------------
        buf_obs = torch.zeros(B, T, obs_dim)
        buf_next_obs = torch.zeros(B, T, obs_dim)  # true successors, for bootstrapping
        buf_actions = torch.zeros(B, T, dtype=torch.long)
        buf_logprobs = torch.zeros(B, T)
        buf_values = torch.zeros(B, T)
        buf_logits = torch.zeros(B, T, num_actions)
        buf_rewards = torch.zeros(B, T)
        buf_terminated = torch.zeros(B, T, dtype=torch.bool)
        buf_truncated = torch.zeros(B, T, dtype=torch.bool)
        n_new_episodes = 0
        with torch.no_grad():
            for t in range(T):
                logits, values = model(obs.to(device))
                logits, values = logits.cpu(), values.cpu()
                logp_all = torch.log_softmax(logits, dim=-1)  # (B, A)
                actions = torch.multinomial(logp_all.exp(), 1, generator=gen).squeeze(-1)  # (B,)
                step = envs.step(actions.numpy())
                buf_obs[:, t] = obs
                buf_actions[:, t] = actions
                buf_logprobs[:, t] = logp_all.gather(-1, actions[:, None]).squeeze(-1)
                buf_values[:, t] = values
                buf_logits[:, t] = logits
                buf_rewards[:, t] = torch.from_numpy(step.rewards)
                buf_terminated[:, t] = torch.from_numpy(step.terminated)
                buf_truncated[:, t] = torch.from_numpy(step.truncated)
                buf_next_obs[:, t] = torch.from_numpy(step.final_obs).reshape(B, obs_dim)
                episodes.extend(step.episodes)
                n_new_episodes += len(step.episodes)
                obs = torch.from_numpy(step.obs).reshape(B, obs_dim)
            global_step += B * T

            # ---- advantages: bootstrap through the true successor of every step -----------
            next_values = model.value(buf_next_obs.to(device)).cpu()  # (B, T)
            ends = buf_terminated | buf_truncated
            ends[:, -1] = True  # the rollout stops here: bootstrap from next_values
            advantages, returns = gae(
                buf_rewards,
                buf_values,
                next_values,
                buf_terminated,
                ends,
                cfg.ppo.gamma,
                cfg.ppo.lam,
            )
            mask = torch.ones(B, T, dtype=torch.bool)
            adv_for_loss = whiten(advantages, mask) if cfg.ppo.norm_adv else advantages

            # ---- energy and weights ------------------------------------------------------
            energy = energy_source(
                EnergyInputs(
                    mask=mask,
                    logits=buf_logits,
                    tokens=buf_actions,
                    advantages=whiten(advantages, mask),
                ),
                cfg.energy,
            )  # (B, T)
            scale = weight_scale_at(cfg, iteration)
            params = (
                cfg.energy if scale is None else dataclasses.replace(cfg.energy, weight_scale=scale)
            )
            weights, bottleneck = weighting(energy, mask, params)
            if cfg.energy.shuffle:
                weights = shuffled_weights(weights, mask, gen)
            weights_active = scale is not None and cfg.energy.weighting != "none"
            loss_weights = weights if weights_active else None

        # ---- update ----------------------------------------------------------------------
        flat = {
            "obs": buf_obs.reshape(B * T, obs_dim),
            "actions": buf_actions.reshape(-1),
            "logprobs": buf_logprobs.reshape(-1),
            "values": buf_values.reshape(-1),
            "advantages": adv_for_loss.reshape(-1),
            "returns": returns.reshape(-1),
            "weights": (loss_weights if loss_weights is not None else torch.ones(B, T)).reshape(-1),
        }
        flat = {k: v.to(device) for k, v in flat.items()}
        sums: dict[str, float] = {}
        n_updates = 0
        grad_norm = torch.zeros(())
        stop = False
        snapshot = Snapshot(model, optimizer)  # the last good state, for a rollback
        for _epoch in range(cfg.ppo.epochs):
            perm = torch.randperm(B * T, generator=gen).to(device)
            for start in range(0, B * T, mb_size):
                idx = perm[start : start + mb_size]
                logits, new_values = model(flat["obs"][idx])
                logp_all = torch.log_softmax(logits, dim=-1)
                new_logprobs = logp_all.gather(-1, flat["actions"][idx, None]).squeeze(-1)
                mb_mask = torch.ones_like(new_logprobs, dtype=torch.bool)
                pg_loss, pg_m = ppo_policy_loss(
                    new_logprobs,
                    flat["logprobs"][idx],
                    flat["advantages"][idx],
                    mb_mask,
                    cfg.ppo.clip_eps,
                    weights=flat["weights"][idx] if loss_weights is not None else None,
                    clip_eps_high=cfg.ppo.clip_eps_high,
                )
                v_loss, v_m = value_loss(
                    new_values,
                    flat["values"][idx],
                    flat["returns"][idx],
                    mb_mask,
                    cfg.ppo.value_clip,
                )
                ent = -(logp_all.exp() * logp_all).sum(-1).mean()
                loss = pg_loss + cfg.ppo.vf_coef * v_loss - cfg.ppo.ent_coef * ent
                grad_norm = guarded_step(
                    loss, model, optimizer, model_params, cfg.ppo.max_grad_norm, snapshot
                )
                if grad_norm is None:
                    skipped_steps += 1
                    continue
                for k, v in {
                    **pg_m,
                    **v_m,
                    "entropy": ent.detach(),
                    "grad_norm": grad_norm,
                }.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                n_updates += 1
                if cfg.ppo.target_kl is not None and float(pg_m["approx_kl"]) > cfg.ppo.target_kl:
                    stop = True
                    break
            if stop:
                break
        means = defaultdict(lambda: float("nan"), {k: v / n_updates for k, v in sums.items()})

        # ---- metrics ---------------------------------------------------------------------
        with torch.no_grad():
            var_y = returns.var()
            explained_var = (
                float("nan") if var_y == 0 else float(1 - (returns - buf_values).var() / var_y)
            )
        elapsed = time.perf_counter() - t_start
        row: dict[str, float] = {
            "train/iteration": iteration + 1,
            "train/lr": optimizer.param_groups[0]["lr"],
            "train/clipfrac": means["clipfrac"],
            "train/approx_kl": means["approx_kl"],
            "train/explained_var": explained_var,
            "train/grad_norm": means["grad_norm"],
            "train/ratio_max": means["ratio_max"],
            "train/updates": n_updates,
            "train/skipped_steps": skipped_steps,
            "train/weighting_active": float(weights_active),
            "loss/policy": means["policy_loss"],
            "loss/value": means["value_loss"],
            "loss/entropy": means["entropy"],
            "loss/value_clipfrac": means["value_clipfrac"],
            "adv/mean": float(advantages.mean()),
            "adv/std": float(advantages.std()),
            "energy/mean": float(masked_mean(energy, mask)),
            "energy/std": float(masked_var(energy, mask).sqrt()),
            "weights/mean": float(weights.mean()),
            "weights/max": float(weights.max()),
            "weights/scale": float(scale) if scale is not None else 1.0,
            "weights/bottleneck_ratio": float(bottleneck.float().mean()),
            "perf/sps": (B * T) / (time.perf_counter() - t_iter),
            "perf/elapsed_s": elapsed,
        }
        if episodes:
            row["rollout/return"] = float(np.mean([e.ret for e in episodes]))
            row["rollout/length"] = float(np.mean([e.length for e in episodes]))
            successes = [e.success for e in episodes if e.success is not None]
            if successes:
                row["rollout/success"] = float(np.mean(successes))
        row["rollout/episodes"] = n_new_episodes
        history.append({"train/global_step": global_step, **row})
        if run is not None:
            run.log(global_step, row)
            every = cfg.log.checkpoint_every
            if (every and (iteration + 1) % every == 0) or iteration + 1 == n_iters:
                trainer_state = {
                    "iteration": iteration + 1,
                    "optimizer": optimizer.state_dict(),
                    "generator": gen.get_state(),
                    "torch_rng": torch.get_rng_state(),
                    "envs": pickle.dumps(envs),
                    "obs": obs,
                    "episodes": list(episodes),
                    "global_step": global_step,
                    "skipped_steps": skipped_steps,
                    "elapsed_s": elapsed,
                }
                run.save_checkpoint(
                    model, iteration + 1, {"global_step": global_step}, trainer_state
                )
        if progress is not None:
            progress(iteration + 1, n_iters, global_step, row)

    envs.close()
    return TrainResult(model=model, history=history, run_dir=run.path if run else None)

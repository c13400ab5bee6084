"""Language-model agents: SFT warm start, then PPO, GRPO or REINFORCE over tokens.

The loop reads top to bottom: (SFT on noisy solver episodes) → freeze a reference copy →
per iteration: rollout → score (log-probs, values, reference log-probs, one forward) →
per-token rewards (KL penalty) → advantages (the algorithm) → epochs of minibatch updates →
log, evaluate, checkpoint. The per-token energy (``cfg.energy``, :mod:`tokenergy.credit.token_credit`)
enters at three places: shaped rewards before the advantages, loss weights in the policy
loss (ActFocus, z-score bottleneck, top-entropy), and a prior KL term in the loss.

Simplifications, stated once: a minibatch is a set of whole episodes; the loss is the mean over
the trained tokens of the minibatch (token-mean aggregation); advantages are whitened over
every trained token of the batch; the KL to the reference is a per-token reward (``k1`` by
default) or a loss term; one AdamW for policy and value head.

The algorithm (``algo.name``) is the advantage estimator registered under that name in
:data:`tokenergy.advantages.ALGORITHMS` (``ppo``, ``grpo``, ``reinforce``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tokenergy.advantages import ALGORITHMS, high_variance_groups
from tokenergy.config import LMRunConfig
from tokenergy.distributed import Parallel
from tokenergy.energy import energy_prior_kl
from tokenergy.losses import kl_estimate, ppo_policy_loss, value_loss
from tokenergy.models.lm import causal_only
from tokenergy.ops import masked_mean, masked_var
from tokenergy.rollout import (
    Scored,
    Trajectories,
    collate,
    score,
    token_logprobs,
)
from tokenergy.rollout.episodes import episode_stats, evaluate, noisy_solver, run_episodes
from tokenergy.runs import Run
from tokenergy.safety import (
    AdaptiveKL,
    Snapshot,
    autocast,
    clip_whiten_rewards,
    guarded_step,
    turn_ends,
)

if TYPE_CHECKING:
    from tokenergy.models.lm import AgentOutput

__all__ = [
    "LMTrainResult",
    "evaluate",
    "noisy_solver",
    "sft",
    "train_lm",
]

ProgressFn = Callable[[int, int, int, dict[str, float]], None]


_SINGLE = Parallel()


@dataclass
class LMTrainResult:
    agent: torch.nn.Module
    history: list[dict[str, float]]
    evals: list[dict[str, float]]
    run_dir: Path | None


# --------------------------------------------------------------------------- helpers


def sft(
    agent: torch.nn.Module,
    cfg: LMRunConfig,
    log: Callable[[int, dict[str, float]], None] | None = None,
    par: Parallel = _SINGLE,
) -> list[float]:
    """Fit the agent to noisy solver episodes (cross-entropy on the agent-written tokens).

    With several processes each fits its share of the episodes (minibatches of
    ``batch_size / world`` each) and the gradients are combined token-weighted, so the update
    is that of the global minibatch.
    """
    s = cfg.sft
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed + par.rank)
    seeds = [int(x) for x in rng.integers(0, cfg.eval.seed_offset, size=s.episodes)]
    seeds = par.shard(seeds, what="SFT episodes")
    batch_size = s.batch_size // par.world
    if batch_size * par.world != s.batch_size:
        raise ValueError(f"sft.batch_size {s.batch_size} does not split over {par.world} processes")
    # Every process draws the solver's noise from its own stream, after the shared seed list.
    data = run_episodes(
        agent,
        cfg,
        seeds,
        turn_fn=noisy_solver(
            s.epsilon, np.random.default_rng([cfg.seed, par.rank]) if par.enabled else rng
        ),
    )
    device = agent.device
    trainable = [p for p in agent.policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=s.lr, weight_decay=0.0)
    n_steps = s.epochs * ((data.batch_size + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - i / max(n_steps, 1))
    losses, step = [], 0
    agent.train()
    for _epoch in range(s.epochs):
        perm = torch.randperm(data.batch_size, generator=gen)
        for start in range(0, data.batch_size, batch_size):
            mb = data.select(perm[start : start + batch_size])
            length = int(mb.last_index.max()) + 1
            tokens = mb.tokens[:, :length].to(device)
            mask = mb.mask[:, :length].to(device)
            out = agent.policy(
                input_ids=tokens,
                attention_mask=causal_only(mb.attention_mask[:, :length].to(device)),
            )
            loss = -masked_mean(token_logprobs(out.logits, tokens), mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            share = par.token_share(mask)  # of the global minibatch's tokens (1.0 alone)
            par.reduce_gradients(trainable, share)
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            sched.step()
            step += 1
            losses.append(float(par.sum(loss.detach() * share)))  # the global token mean
            if log is not None:
                log(step, {"sft/loss": losses[-1], "sft/step": step})
    return losses


def _write_samples(
    run: Run,
    iteration: int,
    traj: Trajectories,
    sc: Scored,
    adv,
    tokenizer,
    energy: torch.Tensor | None,
    weights: torch.Tensor | None,
    k: int = 2,
):
    w = traj.mask.float() if weights is None else weights
    with open(run.path / "samples.jsonl", "a") as f:
        for i in range(min(k, traj.batch_size)):
            n = int(traj.last_index[i]) + 1
            record = {
                "iteration": iteration,
                "episode": i,
                "return": float(traj.episode_return[i]),
                "success": bool(traj.success[i]),
                "tokens": tokenizer.convert_ids_to_tokens(traj.tokens[i, :n].tolist()),
                "roles": traj.roles[i, :n].tolist(),
                "logprob": [round(x, 4) for x in sc.logprobs[i, :n].tolist()],
                "advantage": [round(x, 4) for x in adv[i, :n].tolist()],
                "weight": [round(x, 4) for x in w[i, :n].tolist()],
                "reward": [round(x, 4) for x in traj.rewards[i, :n].tolist()],
            }
            if energy is not None:
                record["energy"] = [round(x, 4) for x in energy[i, :n].tolist()]
            f.write(json.dumps(record) + "\n")


def _scheduled(start: float, final: float | None, iteration: int, n_iters: int) -> float:
    """``start`` moved linearly to ``final`` (when given) over the RL iterations."""
    if final is None or n_iters <= 1:
        return start
    return start + (final - start) * iteration / (n_iters - 1)


class Curriculum:
    """Raises ``env.curriculum_kwarg`` through ``env.curriculum_values`` as training succeeds.

    The training rollouts play the current level; held-out evaluation keeps ``env.kwargs``
    (the task the run is for). The level moves on when the rollout success, averaged over
    the last ``curriculum_window`` iterations at this level, reaches the threshold.
    """

    def __init__(self, cfg: LMRunConfig) -> None:
        self.cfg = cfg
        self.e = cfg.env
        self.level = 0
        self.recent: list[float] = []
        self._configs: dict[int, LMRunConfig] = {}

    @property
    def active(self) -> bool:
        return self.e.curriculum_kwarg is not None

    def config(self) -> LMRunConfig:
        """The run config with the env at the current level (the config itself without one)."""
        if not self.active:
            return self.cfg
        if self.level not in self._configs:
            import dataclasses

            kwargs = {
                **self.e.kwargs,
                self.e.curriculum_kwarg: self.e.curriculum_values[self.level],
            }
            env = dataclasses.replace(self.e, kwargs=kwargs)
            self._configs[self.level] = dataclasses.replace(self.cfg, env=env)
        return self._configs[self.level]

    def after_iteration(self, success: float) -> None:
        if not self.active or self.level + 1 >= len(self.e.curriculum_values):
            return
        self.recent = [*self.recent, success][-self.e.curriculum_window :]
        full = len(self.recent) == self.e.curriculum_window
        if full and sum(self.recent) / len(self.recent) >= self.e.curriculum_threshold:
            self.level += 1
            self.recent = []

    def state_dict(self) -> dict:
        return {"level": self.level, "recent": list(self.recent)}

    def load_state_dict(self, state: dict) -> None:
        self.level = state.get("level", 0)
        self.recent = list(state.get("recent", []))


def _save_agent_folder(agent, dest: Path, info: dict | None = None) -> None:
    """Save ``agent`` (and ``info`` as ``<dest>/<dest.name>.json``) so that ``dest`` appears
    complete or not at all: written beside it, then renamed over it."""
    from tokenergy.models import save_agent

    tmp = dest.with_name(f".{dest.name}-tmp")
    save_agent(agent, tmp)
    if info is not None:
        (tmp / f"{dest.name}.json").write_text(json.dumps(info, indent=1))
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


def _save_best(agent, run_dir: Path, iteration: int, ev: dict[str, float]) -> None:
    """The agent of the best evaluation so far, in ``<run>/best/`` with ``best.json``."""
    _save_agent_folder(agent, run_dir / "best", {"iteration": iteration, **ev})


def _check_parallel(cfg: LMRunConfig, par: Parallel) -> None:
    """Refuse what several processes cannot share, before any work starts."""
    if cfg.energy.source in ("discriminator", "uncertainty") and cfg.energy.active:
        raise ValueError(
            f"energy.source {cfg.energy.source!r} trains a model on each process's own episodes; "
            "it runs in a single process only"
        )
    n_groups = cfg.rollout.episodes // cfg.rollout.group_size
    if n_groups % par.world:
        raise ValueError(
            f"rollout.episodes {cfg.rollout.episodes} (groups of {cfg.rollout.group_size}) do "
            f"not split over {par.world} processes; choose a multiple of "
            f"{cfg.rollout.group_size * par.world}"
        )
    if cfg.rollout.replay_ratio > 0:
        raise ValueError(
            "rollout.replay_ratio: success replay keeps a buffer per process whose sizes differ; "
            "it runs in a single process only"
        )
    if cfg.rollout.curiosity_coef > 0:
        raise ValueError(
            "rollout.curiosity_coef: the next-observation model would learn each process's own "
            "episodes; it runs in a single process only"
        )
    if cfg.algo.sft_coef > 0:
        raise ValueError("algo.sft_coef: the SFT anchor runs in a single process only")
    for field_name in ("episodes", "batch_size"):
        n = getattr(cfg.sft, field_name)
        if cfg.sft.episodes and n % par.world:
            raise ValueError(
                f"sft.{field_name} {n} does not split over {par.world} processes; "
                f"choose a multiple of {par.world}"
            )
    local = cfg.rollout.episodes // par.world
    if local < cfg.algo.minibatches:
        raise ValueError(
            f"{local} episodes per process cannot fill algo.minibatches = {cfg.algo.minibatches}"
        )


def _diagnose(agent, cfg: LMRunConfig, generator: torch.Generator, ref=None) -> dict[str, float]:
    """The action-bottleneck diagnostics' ``diag/*`` metrics, when the config asks for them;
    the energy is the frozen reference's free energy (the agent's own before RL, or when the
    run keeps no reference)."""
    if cfg.eval.diagnose_seeds == 0:
        return {}
    from tokenergy.credit.diagnostics import action_bottleneck

    return action_bottleneck(
        agent, cfg, cfg.eval.diagnose_seeds, cfg.eval.diagnose_group, generator, reference=ref
    )


def reuses_update_logprobs(cfg: LMRunConfig) -> bool:
    """Whether the scoring pass can skip the policy: one update reads the whole batch once, so
    its ratio is 1 and the old log-probs are its own (detached), and nothing before the update
    reads the policy's log-probs, entropy or values (no critic, no KL in the reward, an energy
    of the reference alone)."""
    a = cfg.algo
    return (
        a.epochs == 1
        and a.minibatches == 1
        and a.name != "ppo"
        and not (a.kl_in == "reward" and (a.kl_coef > 0 or a.kl_target))
        and cfg.energy.source in ("ref_surprisal", "ref_free_energy")
    )


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
    from tokenergy.models.lm import AgentOutput

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


@contextlib.contextmanager
def _value_head_swapped(agent: torch.nn.Module, head: torch.nn.Module | None):
    """Score with ``head`` (the target value head) in place of the agent's own."""
    if head is None:
        yield
        return
    live, agent.value_head = agent.value_head, head
    try:
        yield
    finally:
        agent.value_head = live


class _Anchor:
    """The SFT anchor: noisy-solver demonstrations, drawn once, and their NLL under the policy.

    Mixed into the RL loss as ``sft_coef * NLL`` on ``batch`` demonstrations per minibatch, so
    the policy keeps the format and moves it learned by imitation while RL explores.
    """

    def __init__(self, agent, cfg: LMRunConfig, batch: int) -> None:
        rng = np.random.default_rng([cfg.seed, 7])
        n = max(cfg.sft.episodes, batch)
        seeds = [int(x) for x in rng.integers(0, cfg.eval.seed_offset, size=n)]
        self.data = run_episodes(agent, cfg, seeds, turn_fn=noisy_solver(cfg.sft.epsilon, rng))
        self.batch = batch

    def loss(self, agent, device: torch.device, gen: torch.Generator) -> torch.Tensor:
        idx = torch.randperm(self.data.batch_size, generator=gen)[: self.batch]
        mb = self.data.select(idx)
        length = int(mb.last_index.max()) + 1
        tokens = mb.tokens[:, :length].to(device)
        out = agent.policy(
            input_ids=tokens, attention_mask=causal_only(mb.attention_mask[:, :length].to(device))
        )
        return -masked_mean(token_logprobs(out.logits, tokens), mb.mask[:, :length].to(device))


# --------------------------------------------------------------------------- the loop


def train_lm(
    cfg: LMRunConfig,
    run: Run | None = None,
    progress: ProgressFn | None = None,
    agent: torch.nn.Module | None = None,
    resume: Path | None = None,
) -> LMTrainResult:
    """SFT (when ``cfg.sft.episodes > 0``), then ``cfg.algo.iterations`` RL iterations.

    With ``resume`` (an RL checkpoint folder written by this function) SFT is skipped and the
    run continues exactly from that checkpoint: weights, reference, optimizer, random
    generators and counters come back.

    Under ``accelerate launch`` / ``torchrun`` with several processes the run is data-parallel
    (:mod:`tokenergy.distributed`): ``rollout.episodes`` and ``sft.episodes`` are the global
    batches, shared by the processes; only rank 0 writes ``run`` and reports progress. A resumed
    multi-process run restores rank 0's random streams; the others start fresh ones.
    """
    from tokenergy.algos.ppo import resolve_device
    from tokenergy.models.lm import CriticModel, agent_from_config, separate_critic

    device = resolve_device(cfg.device)
    par = Parallel.from_env(device)
    device = par.device(device)
    if par.enabled:
        _check_parallel(cfg, par)
        if not par.is_main:
            run, progress = None, None
    torch.manual_seed(cfg.seed)
    # Each process samples from its own stream; rank 0's is the single-process one.
    gen = torch.Generator().manual_seed(cfg.seed + 1_000_003 * par.rank)
    rng = np.random.default_rng(cfg.seed)  # the episode seeds: the same on every process
    if agent is None:
        agent = agent_from_config(cfg.model, seed=cfg.seed)
    agent = agent.to(device)
    agent.value_scale = cfg.algo.value_scale
    tok = agent.tokenizer
    a = cfg.algo
    advantage_fn = ALGORITHMS.get(a.name)
    trains_value = a.name == "ppo"
    history: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []
    n_iters = a.iterations
    total = n_iters + 1  # progress: SFT counts as one step
    t_start = time.perf_counter()

    def log(step: int, row: dict[str, float]) -> None:
        if run is not None:
            run.log(step, row)

    from tokenergy.credit.token_credit import TokenCredit, solver_batch

    credit = TokenCredit(cfg, len(tok))
    diag_gen = torch.Generator().manual_seed(cfg.seed + 2)

    # ---- SFT warm start -------------------------------------------------------------------
    ts: dict[str, Any] | None = None
    best_success = float("-inf")  # eval.keep_best
    if resume is None:
        if cfg.sft.episodes > 0:
            sft(agent, cfg, log=log if run is not None else None, par=par)
        par.broadcast(agent)
        if cfg.model.critic == "separate":
            separate_critic(agent)  # after SFT: the critic starts from the SFT features
        ev = {
            "train/iteration": 0,
            **evaluate(agent, cfg, par=par),
            **(_diagnose(agent, cfg, diag_gen) if par.is_main else {}),
        }
        credit.after_eval(ev["eval/success"])
        if cfg.eval.keep_best and run is not None:
            best_success = ev["eval/success"]
            _save_best(agent, run.path, 0, ev)
        evals.append(ev)
        log(0, ev)
        if progress is not None:
            progress(1, total, 0, ev)
    else:
        from tokenergy.runs import load_checkpoint, load_trainer_state

        tensors, _, _ = load_checkpoint(resume)
        if cfg.model.critic == "separate":
            separate_critic(agent)  # the checkpoint's structure; its weights load next
        agent.load_state_dict(tensors)
        ts = load_trainer_state(resume)
        par.broadcast(agent)

    # ---- RL -------------------------------------------------------------------------------
    ref = copy.deepcopy(agent.policy).eval().requires_grad_(False) if credit.has_reference else None
    if cfg.model.train_top_blocks is not None:
        from tokenergy.models.lm import freeze_lower_blocks

        freeze_lower_blocks(agent.policy, cfg.model.train_top_blocks)

    if ref is not None and ts is not None:
        ref.load_state_dict(ts["ref"])
    policy_params = [p for p in agent.policy.parameters() if p.requires_grad]
    head_params = list(agent.value_head.parameters())
    params = policy_params + head_params
    # A critic with a transformer of its own has its gradient clipped apart from the policy's.
    clip_apart = [policy_params, head_params] if isinstance(agent.value_head, CriticModel) else None
    opt = torch.optim.AdamW(
        [{"params": policy_params, "lr": a.lr}, {"params": head_params, "lr": a.value_lr}],
        weight_decay=0.0,
    )
    n_groups = cfg.rollout.episodes // cfg.rollout.group_size
    replay: deque = deque(maxlen=cfg.rollout.replay_size)  # successful episodes, newest last
    n_replay = round(cfg.rollout.replay_ratio * cfg.rollout.episodes)
    curriculum = Curriculum(cfg)
    kl_ctl = AdaptiveKL(a.kl_coef, a.kl_target, a.kl_horizon) if a.kl_target else None
    target_head = (
        copy.deepcopy(agent.value_head).requires_grad_(False)
        if a.value_target_tau is not None
        else None
    )
    curiosity = None
    if cfg.rollout.curiosity_coef > 0:
        from tokenergy.credit.energy_models import NextObservationModel

        curiosity = NextObservationModel(len(tok), seed=cfg.seed + 3)
    anchor = None
    if a.sft_coef > 0:
        anchor = _Anchor(agent, cfg, max(1, cfg.rollout.episodes // a.minibatches))
    ratio_skips = 0  # minibatch steps skipped by the ratio cap, over the run
    episodes_done = 0
    skipped_steps = 0  # non-finite steps skipped (and rolled back), over the run
    start_iteration = 0
    if ts is not None:
        opt.load_state_dict(ts["optimizer"])
        gen.set_state(ts["generator"])
        if not par.is_main:
            gen.manual_seed(cfg.seed + 1_000_003 * par.rank + ts["iteration"])
        rng.bit_generator.state = ts["np_rng"]
        torch.set_rng_state(ts["torch_rng"])
        episodes_done, skipped_steps = ts["episodes_done"], ts["skipped_steps"]
        credit.load_state_dict(ts["credit"])
        diag_gen.set_state(ts["diag_generator"])
        start_iteration = ts["iteration"]
        replay.extend(ts.get("replay", []))
        curriculum.load_state_dict(ts.get("curriculum", {}))
        best_success = ts.get("best_success", best_success)
        envelope = ts.get("envelope", {})
        ratio_skips = envelope.get("ratio_skips", 0)
        if kl_ctl is not None and "kl_ctl" in envelope:
            kl_ctl.load_state_dict(envelope["kl_ctl"])
        if target_head is not None and "target_head" in envelope:
            target_head.load_state_dict(envelope["target_head"])
        if curiosity is not None and "curiosity" in envelope:
            curiosity.load_state_dict(envelope["curiosity"])
        t_start -= ts["elapsed_s"]
        if run is not None:
            from tokenergy.runs import read_metrics

            history = [r for r in read_metrics(run.path) if r.get("train/iteration", 0) > 0]
            evals = [r for r in read_metrics(run.path) if "eval/success" in r]
    reuse_logprobs = reuses_update_logprobs(cfg)
    for iteration in range(start_iteration, n_iters):
        t0 = time.perf_counter()
        env_seeds = rng.integers(0, cfg.eval.seed_offset, size=n_groups)
        seeds = [int(s) for s in np.repeat(env_seeds, cfg.rollout.group_size)]
        seeds = par.shard(seeds, cfg.rollout.group_size, what="episodes")  # whole groups
        groups = [i // cfg.rollout.group_size for i in range(len(seeds))]
        agent.eval()
        fresh = run_episodes(agent, curriculum.config(), seeds, generator=gen, groups=groups)
        episodes_done += fresh.batch_size * par.world
        traj, replayed = fresh, 0
        if cfg.rollout.keep_groups < 1.0:  # StarPO-S: train on the groups whose returns vary
            kept = high_variance_groups(
                torch.tensor([e.episode_return for e in fresh.episodes], dtype=torch.float64),
                torch.tensor([e.group for e in fresh.episodes]),
                cfg.rollout.keep_groups,
            )
            traj = collate([e for e, k in zip(fresh.episodes, kept.tolist(), strict=True) if k],
                           tok.pad_token_id)  # fmt: skip
        if n_replay and replay:  # success replay: earlier successes join the batch
            picks = torch.randint(len(replay), (min(n_replay, len(replay)),), generator=gen)
            old = [replay[int(i)] for i in picks]
            traj, replayed = collate(traj.episodes + old, tok.pad_token_id), len(old)
        if n_replay:
            replay.extend(e for e in fresh.episodes if e.success)
        t_rollout = time.perf_counter() - t0

        # ---- score, rewards, advantages (no gradient) ------------------------------------
        t1 = time.perf_counter()
        with autocast(device, a.precision), _value_head_swapped(agent, target_head):
            sc = score(agent, ref, traj, extras=frozenset({cfg.energy.source}),
                       policy=not reuse_logprobs)  # fmt: skip
        t_score = time.perf_counter() - t1
        mask = traj.mask
        kl_tok = kl_estimate(sc.logprobs, sc.ref_logprobs, a.kl_kind) * mask  # (B, T)
        rewards = traj.rewards.clone()
        envelope_row: dict[str, float] = {}
        ends = turn_ends(mask)  # where each turn's reward sits
        if a.reward_whiten:
            rewards, frac = clip_whiten_rewards(rewards, ends, a.reward_clip, par)
            envelope_row["envelope/reward_clipped"] = frac
        if curiosity is not None:
            bonus = curiosity.bonus(traj.tokens, traj.roles, mask, traj.attention_mask)
            rewards = rewards + cfg.rollout.curiosity_coef * bonus
            envelope_row["rollout/curiosity"] = float(bonus.sum() / ends.sum().clamp(min=1))
            envelope_row["loss/next_obs"] = curiosity.update(
                traj.tokens, traj.roles, mask, traj.attention_mask
            )
        kl_coef = kl_ctl.value if kl_ctl is not None else a.kl_coef
        if kl_coef > 0 and a.kl_in == "reward":
            rewards = rewards - kl_coef * kl_tok
        # A source that reads the reference is skipped when the run has none (energy unused).
        has_energy = ref is not None or not cfg.energy.reads_reference
        energy = credit.energy(traj, sc) if has_energy and not credit.needs_advantages else None
        if energy is not None:
            rewards = credit.shape(rewards, energy, traj, iteration)
        res = advantage_fn(traj, sc, rewards, a, par=par)
        advantages = res.advantages
        adv_loss = par.whiten(advantages, mask) if a.norm_adv else advantages
        if has_energy and energy is None:
            energy = credit.energy(traj, sc, par.whiten(advantages, mask))
        weights = credit.weights(energy, traj, iteration, gen) if has_energy else None
        prior_coef = credit.prior_coef(iteration)
        if has_energy:
            solver = (
                solver_batch(cfg, agent, seeds) if cfg.energy.source == "discriminator" else None
            )
            credit.update_learned(traj, solver)

        # ---- update -------------------------------------------------------------------------
        critic_only = iteration < a.critic_warmup_iters  # the value head learns, the policy waits
        clip_eps = _scheduled(a.clip_eps, a.clip_eps_final, iteration, n_iters)
        ent_coef = _scheduled(a.ent_coef, a.ent_coef_final, iteration, n_iters)
        sft_coef = _scheduled(a.sft_coef, a.sft_coef_final, iteration, n_iters)
        agent.train()
        snapshot = Snapshot(agent, opt)  # the last good state, for a rollback
        sums: dict[str, float] = {}
        n_updates = 0
        mb_size = max(1, traj.batch_size // a.minibatches)
        for _epoch in range(a.epochs):
            perm = torch.randperm(traj.batch_size, generator=gen)
            for start in range(0, traj.batch_size, mb_size):
                idx = perm[start : start + mb_size]
                length = int(traj.last_index[idx].max()) + 1
                cols = slice(0, length)
                tokens = traj.tokens[idx, cols].to(device)
                mb_mask = mask[idx, cols].to(device)
                with autocast(device, a.precision):
                    out = forward_by_length(
                        agent,
                        tokens,
                        traj.attention_mask[idx, cols].to(device),
                        traj.last_index[idx] + 1,
                        trains_value,
                        value_grad_to_policy=not critic_only,
                    )
                new_logprobs = token_logprobs(out.logits, tokens)
                if reuse_logprobs:  # the only update, over the whole batch: the ratio is 1
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
                        ratio_skips += 1
                        continue
                pg_loss, pg_m = ppo_policy_loss(
                    new_logprobs,
                    old_logprobs,
                    adv_loss[idx, cols].to(device),
                    mb_mask,
                    clip_eps,
                    weights=None if weights is None else weights[idx, cols].to(device),
                    clip_eps_high=a.clip_eps_high,
                    normalize=a.loss_normalize,
                )
                loss = pg_loss
                metrics = dict(pg_m)
                if trains_value:
                    v = out.values
                    new_values = torch.cat([v.new_zeros(v.shape[0], 1), v[:, :-1]], 1)
                    v_loss, v_m = value_loss(
                        new_values,
                        sc.values[idx, cols].to(device),
                        res.returns[idx, cols].to(device),
                        mb_mask,
                        a.value_clip,
                    )
                    loss = loss + a.vf_coef * v_loss
                    metrics.update(v_m)
                if ent_coef > 0:
                    logp = torch.log_softmax(out.logits[:, :-1].float(), -1)
                    ent = -(logp.exp() * logp).sum(-1)
                    ent = torch.cat([ent.new_zeros(ent.shape[0], 1), ent], 1)
                    ent_mean = masked_mean(ent, mb_mask)
                    loss = loss - ent_coef * ent_mean
                    metrics["entropy_bonus"] = ent_mean.detach()
                if kl_coef > 0 and a.kl_in == "loss":
                    kl = masked_mean(
                        kl_estimate(new_logprobs, sc.ref_logprobs[idx, cols].to(device), a.kl_kind),
                        mb_mask,
                    )
                    loss = loss + kl_coef * kl
                    metrics["kl_loss"] = kl.detach()
                if prior_coef > 0:
                    # pi_E ∝ exp(-E_vocab / tau) with E_vocab = -log pi_ref: a softened reference.
                    with torch.no_grad():
                        attn = traj.attention_mask[idx, cols].to(device)
                        ref_logits = ref(
                            input_ids=tokens, attention_mask=causal_only(attn), use_cache=False
                        ).logits[:, :-1]
                    prior = energy_prior_kl(
                        out.logits[:, :-1],
                        -torch.log_softmax(ref_logits.float(), -1),
                        mb_mask[:, 1:],
                        cfg.energy.prior_tau,
                    )
                    loss = loss + prior_coef * prior
                    metrics["prior_kl"] = prior.detach()
                if anchor is not None and sft_coef > 0 and not critic_only:
                    with autocast(device, a.precision):
                        anchor_nll = anchor.loss(agent, device, gen)
                    loss = loss + sft_coef * anchor_nll
                    metrics["sft_anchor"] = anchor_nll.detach()
                if critic_only:
                    loss = a.vf_coef * v_loss
                share = par.token_share(mb_mask)
                grad_norm = guarded_step(
                    loss, agent, opt, params, a.max_grad_norm, snapshot, par=par, share=share,
                    clip_apart=clip_apart,
                )  # fmt: skip
                if grad_norm is None:
                    skipped_steps += 1
                    continue
                metrics["grad_norm"] = grad_norm
                for k, val in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(val)
                n_updates += 1
        means = defaultdict(
            lambda: float("nan"), {k: v / max(n_updates, 1) for k, v in sums.items()}
        )
        if target_head is not None:  # soft update toward the value head just trained
            with torch.no_grad():
                for tp, p in zip(
                    target_head.parameters(), agent.value_head.parameters(), strict=True
                ):
                    tp.lerp_(p, a.value_target_tau)
        t_update = time.perf_counter() - t1

        # ---- metrics ------------------------------------------------------------------------
        trained_tokens = int(mask.sum())
        row: dict[str, float] = {
            "train/iteration": iteration + 1,
            "train/episodes": episodes_done,
            "train/lr": opt.param_groups[0]["lr"],
            "train/clipfrac": means["clipfrac"],
            "train/approx_kl": means["approx_kl"],
            "train/grad_norm": means["grad_norm"],
            "train/ratio_max": means["ratio_max"],
            "train/updates": n_updates,
            "train/skipped_steps": skipped_steps,
            "train/critic_only": float(critic_only),
            "loss/policy": means["policy_loss"],
            "loss/entropy": float(masked_mean(sc.entropy, mask)),
            "kl/ref": float(masked_mean(kl_estimate(sc.logprobs, sc.ref_logprobs, "k3"), mask)),
            "adv/mean": float(masked_mean(advantages, mask)),
            "adv/std": float(masked_var(advantages, mask).sqrt()),
            **episode_stats(fresh, "rollout"),  # the new episodes (replayed ones excluded)
            "rollout/replayed": replayed,
            "rollout/trained_episodes": traj.batch_size,
            "train/clip_eps": clip_eps,
            "train/ent_coef": ent_coef,
            "train/curriculum_level": curriculum.level,
            "train/kl_coef": kl_coef,
            "envelope/ratio_skips": ratio_skips,
            **envelope_row,
            "perf/rollout_s": t_rollout,
            "perf/score_s": t_score,  # the no-gradient forward passes, inside update_s
            "perf/update_s": t_update,
            "perf/gen_tokens_per_s": trained_tokens / max(t_rollout, 1e-9),
            "perf/update_tokens_per_s": a.epochs
            * int(traj.attention_mask.sum())
            / max(t_update, 1e-9),
            "perf/elapsed_s": time.perf_counter() - t_start,
        }
        if trains_value:
            var_r = masked_var(res.returns, mask)
            row["loss/value"] = means["value_loss"]
            row["loss/value_clipfrac"] = means["value_clipfrac"]
            row["train/explained_var"] = (
                float("nan")
                if float(var_r) == 0
                else float(1 - masked_var(res.returns - sc.values, mask) / var_r)
            )
        if "kl_loss" in means:
            row["loss/kl"] = means["kl_loss"]
        if "entropy_bonus" in means:
            row["loss/entropy_bonus"] = means["entropy_bonus"]
        if "prior_kl" in means:
            row["loss/prior_kl"] = means["prior_kl"]
        if anchor is not None:
            row["loss/sft_anchor"] = means["sft_anchor"]
            row["train/sft_coef"] = sft_coef
        if energy is not None:
            row.update(credit.metrics(energy, weights, traj, iteration))
        row = par.average_metrics(row, float(fresh.batch_size))
        curriculum.after_iteration(row["rollout/success"])
        if kl_ctl is not None:
            kl_ctl.update(row["kl/ref"], fresh.batch_size * par.world)
        last = iteration + 1 == n_iters
        if (iteration + 1) % cfg.eval.every == 0 or last:
            ev = evaluate(agent, cfg, par=par)
            if par.is_main:
                ev.update(_diagnose(agent, cfg, diag_gen, ref))
            row.update(ev)
            evals.append({"train/iteration": iteration + 1, **ev})
            credit.after_eval(ev["eval/success"])
            if cfg.eval.keep_best and run is not None and ev["eval/success"] > best_success:
                best_success = ev["eval/success"]
                _save_best(agent, run.path, iteration + 1, ev)
        history.append({"train/global_step": episodes_done, **row})
        if run is not None:
            run.log(episodes_done, row)
            if iteration % max(1, n_iters // 10) == 0 or last:
                _write_samples(run, iteration + 1, traj, sc, advantages, tok, energy, weights)
            every = cfg.log.checkpoint_every
            if (every and (iteration + 1) % every == 0) or last:
                trainer_state = {  # rank 0's
                    "iteration": iteration + 1,
                    "optimizer": opt.state_dict(),
                    "generator": gen.get_state(),
                    "np_rng": rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state(),
                    "episodes_done": episodes_done,
                    "skipped_steps": skipped_steps,
                    "replay": list(replay),
                    "curriculum": curriculum.state_dict(),
                    "best_success": best_success,
                    "envelope": {
                        "ratio_skips": ratio_skips,
                        "kl_ctl": kl_ctl.state_dict() if kl_ctl is not None else None,
                        "target_head": target_head.state_dict()
                        if target_head is not None
                        else None,
                        "curiosity": curiosity.state_dict() if curiosity is not None else None,
                    },
                    "credit": credit.state_dict(),
                    "diag_generator": diag_gen.get_state(),
                    "elapsed_s": time.perf_counter() - t_start,
                    "ref": {k: v.detach().cpu().clone() for k, v in ref.state_dict().items()}
                    if ref is not None
                    else None,
                }
                run.save_checkpoint(
                    agent, iteration + 1, {"episodes": episodes_done}, trainer_state
                )
        if progress is not None:
            progress(iteration + 2, total, episodes_done, row)

    if run is not None:
        _save_agent_folder(agent, run.path / "agent")
    return LMTrainResult(agent, history, evals, run.path if run is not None else None)

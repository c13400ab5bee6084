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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tokenergy.advantages import ALGORITHMS, high_variance_groups, shuffled_returns
from tokenergy.algos.update import Credit, UpdateStats, update, update_optimizer
from tokenergy.config import LMRunConfig
from tokenergy.config.lm import REFERENCE_ONLY_SOURCES
from tokenergy.distributed import Parallel
from tokenergy.losses import kl_estimate
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
    autocast,
    clip_whiten_rewards,
    turn_ends,
)

__all__ = [
    "LMTrainResult",
    "LMTrainer",
    "assign_credit",
    "collect",
    "evaluate_and_save",
    "score_batch",
    "sft",
    "train_lm",
    "update",
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
    round_: int = 0,
) -> list[float]:
    """Fit the agent to noisy solver episodes (cross-entropy on the agent-written tokens).

    With several processes each fits its share of the episodes (minibatches of
    ``batch_size / world`` each) and the gradients are combined token-weighted, so the update
    is that of the global minibatch. A later ``round_`` trains on from the agent as it is:
    the same demonstrations, other minibatches, the learning rate annealed again, its steps
    logged after the earlier rounds'.
    """
    s = cfg.sft
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed + par.rank + 1_000_003 * round_)
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
    losses, step = [], round_ * n_steps
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
        and cfg.energy.source in REFERENCE_ONLY_SOURCES
    )


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

    An iteration is five stages, each a function below: :func:`collect` (episodes) →
    :func:`score_batch` (log-probs, values, the reference; no gradient) →
    :func:`assign_credit` (rewards, energies, advantages, loss weights) → :func:`update`
    (epochs of minibatch steps) → :func:`iteration_metrics`, then :func:`evaluate_and_save`
    (evaluation, logging, samples, checkpoint).

    With ``resume`` (an RL checkpoint folder written by this function) SFT is skipped and the
    run continues exactly from that checkpoint: weights, reference, optimizer, random
    generators and counters come back.

    Under ``accelerate launch`` / ``torchrun`` with several processes the run is data-parallel
    (:mod:`tokenergy.distributed`): ``rollout.episodes`` and ``sft.episodes`` are the global
    batches, shared by the processes; only rank 0 writes ``run`` and reports progress. A resumed
    multi-process run restores rank 0's random streams; the others start fresh ones.
    """
    t = LMTrainer.start(cfg, run, progress, agent, resume)
    for iteration in range(t.start_iteration, cfg.algo.iterations):
        t0 = time.perf_counter()
        batch = collect(t)
        t_rollout = time.perf_counter() - t0
        t1 = time.perf_counter()
        sc = score_batch(t, batch.traj)
        t_score = time.perf_counter() - t1
        cr = assign_credit(t, batch, sc, iteration)
        up = update(t, batch.traj, sc, cr, iteration)
        t_update = time.perf_counter() - t1
        row = iteration_metrics(t, iteration, batch, sc, cr, up)
        row.update(perf_metrics(t, batch.traj, t_rollout, t_score, t_update))
        evaluate_and_save(t, iteration, row, batch, sc, cr)
    if t.run is not None:
        _save_agent_folder(t.agent, t.run.path / "agent")
    return LMTrainResult(t.agent, t.history, t.evals, t.run.path if t.run is not None else None)


@dataclass
class LMTrainer:
    """Everything an LM run carries from one iteration to the next: the agent and its frozen
    reference, the optimizer, the random streams, the credit stage, the envelope's controllers
    and the run's counters and records. :meth:`start` builds it (SFT, or a checkpoint)."""

    cfg: LMRunConfig
    run: Run | None
    progress: ProgressFn | None
    par: Parallel
    device: torch.device
    agent: torch.nn.Module
    ref: torch.nn.Module | None
    opt: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    clip_apart: list[list[torch.nn.Parameter]] | None
    gen: torch.Generator  # sampling, minibatch order, weights' noise, the SFT anchor
    rng: np.random.Generator  # the episode seeds: the same on every process
    diag_gen: torch.Generator
    credit: Any  # tokenergy.credit.token_credit.TokenCredit
    curriculum: Curriculum
    kl_ctl: AdaptiveKL | None
    target_head: torch.nn.Module | None
    curiosity: Any  # tokenergy.credit.energy_models.NextObservationModel or None
    anchor: _Anchor | None
    replay: deque  # successful episodes, newest last
    reuse_logprobs: bool
    t_start: float
    start_iteration: int = 0
    episodes_done: int = 0
    skipped_steps: int = 0  # non-finite steps skipped (and rolled back), over the run
    ratio_skips: int = 0  # minibatch steps skipped by the ratio cap, over the run
    best_success: float = float("-inf")  # eval.keep_best
    history: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)

    @property
    def trains_value(self) -> bool:
        return self.cfg.algo.name == "ppo"

    @property
    def algo(self):  # the update stage's settings (tokenergy.algos.update.Learner)
        return self.cfg.algo

    @property
    def prior_tau(self) -> float:
        return self.cfg.energy.prior_tau

    @property
    def rollback(self) -> bool:  # a non-finite step is always skipped and rolled back here
        return True

    def log(self, step: int, row: dict[str, float]) -> None:
        if self.run is not None:
            self.run.log(step, row)

    @classmethod
    def start(cls, cfg, run, progress, agent, resume) -> LMTrainer:
        """The trainer after SFT and the first evaluation (logged at iteration 0), or after
        loading the checkpoint ``resume``."""
        from tokenergy.algos.ppo import resolve_device
        from tokenergy.credit.token_credit import TokenCredit
        from tokenergy.models.lm import agent_from_config

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
        rng = np.random.default_rng(cfg.seed)
        t_start = time.perf_counter()
        if agent is None:
            agent = agent_from_config(cfg.model, seed=cfg.seed)
        agent = agent.to(device)
        agent.value_scale = cfg.algo.value_scale
        credit = TokenCredit(cfg, len(agent.tokenizer))
        diag_gen = torch.Generator().manual_seed(cfg.seed + 2)
        if resume is None:
            first_eval, ts = _warm_start(cfg, run, progress, agent, par, credit, diag_gen), None
        else:
            first_eval, ts = None, _load_weights(cfg, agent, par, resume)
        t = cls._build(cfg, run, progress, par, device, agent, credit, gen, rng, diag_gen, t_start)
        if first_eval is not None:
            t.evals.append(first_eval)
            if cfg.eval.keep_best and run is not None:
                t.best_success = first_eval["eval/success"]
                _save_best(agent, run.path, 0, first_eval)
        if ts is not None:
            t.restore(ts)
        return t

    @classmethod
    def _build(cls, cfg, run, progress, par, device, agent, credit, gen, rng, diag_gen, t_start):
        from tokenergy.models.lm import CriticModel

        a = cfg.algo
        ref = (
            copy.deepcopy(agent.policy).eval().requires_grad_(False)
            if credit.has_reference
            else None
        )
        if cfg.model.train_top_blocks is not None:
            from tokenergy.models.lm import freeze_lower_blocks

            freeze_lower_blocks(agent.policy, cfg.model.train_top_blocks)
        opt, policy_params, head_params = update_optimizer(agent, a.lr, a.value_lr)
        # A critic with a transformer of its own has its gradient clipped apart from the policy's.
        critic = isinstance(agent.value_head, CriticModel)
        curiosity = None
        if cfg.rollout.curiosity_coef > 0:
            from tokenergy.credit.energy_models import NextObservationModel

            curiosity = NextObservationModel(len(agent.tokenizer), seed=cfg.seed + 3)
        return cls(
            cfg=cfg, run=run, progress=progress, par=par, device=device, agent=agent, ref=ref,
            opt=opt, params=policy_params + head_params,
            clip_apart=[policy_params, head_params] if critic else None,
            gen=gen, rng=rng, diag_gen=diag_gen, credit=credit, curriculum=Curriculum(cfg),
            kl_ctl=AdaptiveKL(a.kl_coef, a.kl_target, a.kl_horizon) if a.kl_target else None,
            target_head=copy.deepcopy(agent.value_head).requires_grad_(False)
            if a.value_target_tau is not None
            else None,
            curiosity=curiosity,
            anchor=_Anchor(agent, cfg, max(1, cfg.rollout.episodes // a.minibatches))
            if a.sft_coef > 0
            else None,
            replay=deque(maxlen=cfg.rollout.replay_size),
            reuse_logprobs=reuses_update_logprobs(cfg),
            t_start=t_start,
        )  # fmt: skip

    def restore(self, ts: dict[str, Any]) -> None:
        """Continue from a checkpoint's trainer state (written by :meth:`state_dict`)."""
        if self.ref is not None:
            self.ref.load_state_dict(ts["ref"])
        self.opt.load_state_dict(ts["optimizer"])
        self.gen.set_state(ts["generator"])
        if not self.par.is_main:
            self.gen.manual_seed(self.cfg.seed + 1_000_003 * self.par.rank + ts["iteration"])
        self.rng.bit_generator.state = ts["np_rng"]
        torch.set_rng_state(ts["torch_rng"])
        self.episodes_done, self.skipped_steps = ts["episodes_done"], ts["skipped_steps"]
        self.credit.load_state_dict(ts["credit"])
        self.diag_gen.set_state(ts["diag_generator"])
        self.start_iteration = ts["iteration"]
        self.replay.extend(ts.get("replay", []))
        self.curriculum.load_state_dict(ts.get("curriculum", {}))
        self.best_success = ts.get("best_success", self.best_success)
        envelope = ts.get("envelope", {})
        self.ratio_skips = envelope.get("ratio_skips", 0)
        if self.kl_ctl is not None and "kl_ctl" in envelope:
            self.kl_ctl.load_state_dict(envelope["kl_ctl"])
        if self.target_head is not None and "target_head" in envelope:
            self.target_head.load_state_dict(envelope["target_head"])
        if self.curiosity is not None and "curiosity" in envelope:
            self.curiosity.load_state_dict(envelope["curiosity"])
        self.t_start -= ts["elapsed_s"]
        if self.run is not None:
            from tokenergy.runs import read_metrics

            rows = read_metrics(self.run.path)
            self.history = [r for r in rows if r.get("train/iteration", 0) > 0]
            self.evals = [r for r in rows if "eval/success" in r]

    def state_dict(self, iteration: int) -> dict[str, Any]:
        """The trainer state a checkpoint after ``iteration`` iterations holds (rank 0's)."""
        return {
            "iteration": iteration,
            "optimizer": self.opt.state_dict(),
            "generator": self.gen.get_state(),
            "np_rng": self.rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
            "episodes_done": self.episodes_done,
            "skipped_steps": self.skipped_steps,
            "replay": list(self.replay),
            "curriculum": self.curriculum.state_dict(),
            "best_success": self.best_success,
            "envelope": {
                "ratio_skips": self.ratio_skips,
                "kl_ctl": self.kl_ctl.state_dict() if self.kl_ctl is not None else None,
                "target_head": None if self.target_head is None else self.target_head.state_dict(),
                "curiosity": None if self.curiosity is None else self.curiosity.state_dict(),
            },
            "credit": self.credit.state_dict(),
            "diag_generator": self.diag_gen.get_state(),
            "elapsed_s": time.perf_counter() - self.t_start,
            "ref": None
            if self.ref is None
            else {k: v.detach().cpu().clone() for k, v in self.ref.state_dict().items()},
        }


def _warm_start(cfg, run, progress, agent, par, credit, diag_gen) -> dict[str, float]:
    """SFT (when configured, with its perception gate), the separate critic, and the evaluation
    at iteration 0 (logged, returned)."""
    from tokenergy.models.lm import separate_critic

    ev = _sft_until_it_sees(agent, cfg, run, par) if cfg.sft.episodes > 0 else None
    par.broadcast(agent)
    if cfg.model.critic == "separate":
        separate_critic(agent)  # after SFT: the critic starts from the SFT features
    ev = {
        "train/iteration": 0,
        **(ev if ev is not None else evaluate(agent, cfg, par=par)),
        **(_diagnose(agent, cfg, diag_gen) if par.is_main else {}),
    }
    credit.after_eval(ev["eval/success"])
    if run is not None:
        run.log(0, ev)
    if progress is not None:
        progress(1, cfg.algo.iterations + 1, 0, ev)  # progress: SFT counts as one step
    return ev


def _sft_until_it_sees(agent, cfg, run, par) -> dict[str, float]:
    """SFT, then the held-out evaluation; while the scratchpads state the state word for word
    on fewer than ``sft.min_state_exact`` of the turns, another round of SFT (at most
    ``sft.max_rounds``). Returns the last evaluation (the run's iteration 0).

    The gate reads the evaluation every run makes at iteration 0, so an agent that passes at
    the first round trains exactly as without a gate."""
    s = cfg.sft
    log = run.log if run is not None else None
    for round_ in range(s.max_rounds):
        sft(agent, cfg, log=log, par=par, round_=round_)
        par.broadcast(agent)
        ev = evaluate(agent, cfg, par=par)
        if s.min_state_exact <= 0:
            return ev
        seen = ev["eval/state_exact"]  # the config checked that the env states its state
        if log is not None:
            log(0, {"sft/round": round_ + 1, "sft/state_exact": seen})
        if seen >= s.min_state_exact:
            return ev
    if log is not None:
        log(0, {"sft/gate_failed": 1.0})
    return ev


def _load_weights(cfg, agent, par, resume: Path) -> dict[str, Any]:
    """Load a checkpoint's weights into ``agent``; returns its trainer state."""
    from tokenergy.models.lm import separate_critic
    from tokenergy.runs import load_checkpoint, load_trainer_state

    tensors, _, _ = load_checkpoint(resume)
    if cfg.model.critic == "separate":
        separate_critic(agent)  # the checkpoint's structure; its weights load next
    agent.load_state_dict(tensors)
    ts = load_trainer_state(resume)
    par.broadcast(agent)
    return ts


@dataclass
class Batch:
    """What :func:`collect` gathered: the new episodes, the batch that trains (StarPO-S's kept
    groups and replayed successes), and the env seeds of the new episodes."""

    fresh: Trajectories
    traj: Trajectories
    replayed: int
    seeds: list[int]


def collect(t: LMTrainer) -> Batch:
    """Stage 1: play ``rollout.episodes`` new episodes (``group_size`` per env seed) with the
    current policy; keep the groups whose returns vary most (``rollout.keep_groups``); add
    earlier successes (``rollout.replay_ratio``). Reads the policy, ``t.rng`` and ``t.gen``;
    writes ``t.replay`` and ``t.episodes_done``."""
    cfg, par, tok = t.cfg, t.par, t.agent.tokenizer
    n_groups = cfg.rollout.episodes // cfg.rollout.group_size
    n_replay = round(cfg.rollout.replay_ratio * cfg.rollout.episodes)
    env_seeds = t.rng.integers(0, cfg.eval.seed_offset, size=n_groups)
    seeds = [int(s) for s in np.repeat(env_seeds, cfg.rollout.group_size)]
    seeds = par.shard(seeds, cfg.rollout.group_size, what="episodes")  # whole groups
    groups = [i // cfg.rollout.group_size for i in range(len(seeds))]
    t.agent.eval()
    fresh = run_episodes(t.agent, t.curriculum.config(), seeds, generator=t.gen, groups=groups)
    t.episodes_done += fresh.batch_size * par.world
    traj, replayed = fresh, 0
    if cfg.rollout.keep_groups < 1.0:  # StarPO-S: train on the groups whose returns vary
        kept = high_variance_groups(
            torch.tensor([e.episode_return for e in fresh.episodes], dtype=torch.float64),
            torch.tensor([e.group for e in fresh.episodes]),
            cfg.rollout.keep_groups,
        )
        traj = collate([e for e, k in zip(fresh.episodes, kept.tolist(), strict=True) if k],
                       tok.pad_token_id)  # fmt: skip
    if n_replay and t.replay:  # success replay: earlier successes join the batch
        picks = torch.randint(len(t.replay), (min(n_replay, len(t.replay)),), generator=t.gen)
        old = [t.replay[int(i)] for i in picks]
        traj, replayed = collate(traj.episodes + old, tok.pad_token_id), len(old)
    if n_replay:
        t.replay.extend(e for e in fresh.episodes if e.success)
    return Batch(fresh, traj, replayed, seeds)


def score_batch(t: LMTrainer, traj: Trajectories) -> Scored:
    """Stage 2: one forward pass per model over the batch, without gradient: the policy's
    log-probs and entropies (skipped when the update recomputes them, ratio 1), the value
    head's values (the target head's, with ``algo.value_target_tau``), the reference's
    log-probs and the energy source's extras."""
    with autocast(t.device, t.cfg.algo.precision), _value_head_swapped(t.agent, t.target_head):
        return score(t.agent, t.ref, traj, extras=frozenset({t.cfg.energy.source}),
                     policy=not t.reuse_logprobs)  # fmt: skip


def assign_credit(t: LMTrainer, batch: Batch, sc: Scored, iteration: int) -> Credit:
    """Stage 3: the per-token rewards (whitened and clipped, a curiosity bonus, the KL penalty
    when it is a reward), the energy and its shaping, the algorithm's advantages and the loss
    weights; the learned energy models take their step here. No gradient reaches the policy."""
    from tokenergy.credit.token_credit import solver_batch

    cfg, a, par, traj = t.cfg, t.cfg.algo, t.par, batch.traj
    mask = traj.mask
    kl_tok = kl_estimate(sc.logprobs, sc.ref_logprobs, a.kl_kind) * mask  # (B, T)
    rewards = traj.rewards.clone()
    if a.null_returns:  # the null control: returns shuffled across the batch
        rewards = shuffled_returns(rewards, mask, t.gen)
    envelope_row: dict[str, float] = {}
    ends = turn_ends(mask)  # where each turn's reward sits
    if a.reward_whiten:
        rewards, frac = clip_whiten_rewards(rewards, ends, a.reward_clip, par)
        envelope_row["envelope/reward_clipped"] = frac
    if t.curiosity is not None:
        bonus = t.curiosity.bonus(traj.tokens, traj.roles, mask, traj.attention_mask)
        rewards = rewards + cfg.rollout.curiosity_coef * bonus
        envelope_row["rollout/curiosity"] = float(bonus.sum() / ends.sum().clamp(min=1))
        envelope_row["loss/next_obs"] = t.curiosity.update(
            traj.tokens, traj.roles, mask, traj.attention_mask
        )
    kl_coef = t.kl_ctl.value if t.kl_ctl is not None else a.kl_coef
    if kl_coef > 0 and a.kl_in == "reward":
        rewards = rewards - kl_coef * kl_tok
    # A source that reads the reference is skipped when the run has none (energy unused).
    has_energy = t.ref is not None or not cfg.energy.reads_reference
    credit = t.credit
    energy = credit.energy(traj, sc) if has_energy and not credit.needs_advantages else None
    if energy is not None:
        rewards = credit.shape(rewards, energy, traj, iteration)
    res = ALGORITHMS.get(a.name)(traj, sc, rewards, a, par=par)
    advantages = res.advantages
    adv_loss = par.whiten(advantages, mask) if a.norm_adv else advantages
    if has_energy and energy is None:
        energy = credit.energy(traj, sc, par.whiten(advantages, mask))
    reduce_sum = t.par.sum if t.par.enabled else None  # batch statistics of the global batch
    weights = credit.weights(energy, traj, iteration, t.gen, reduce_sum) if has_energy else None
    prior_coef = credit.prior_coef(iteration)
    if has_energy:
        solver = (
            solver_batch(cfg, t.agent, batch.seeds)
            if cfg.energy.source == "discriminator"
            else None
        )
        credit.update_learned(traj, solver)
    return Credit(
        advantages, adv_loss, res.returns, energy, weights, kl_coef, prior_coef, envelope_row
    )


def iteration_metrics(
    t: LMTrainer, iteration: int, batch: Batch, sc: Scored, cr: Credit, up: UpdateStats
) -> dict[str, float]:
    """The iteration's row (docs/metrics.md): training, losses, advantages, the new episodes'
    stats, the envelope and the credit's metrics (averaged over processes later)."""
    traj, mask, means = batch.traj, batch.traj.mask, up.means
    row: dict[str, float] = {
        "train/iteration": iteration + 1,
        "train/episodes": t.episodes_done,
        "train/lr": t.opt.param_groups[0]["lr"],
        "train/clipfrac": means["clipfrac"],
        "train/approx_kl": means["approx_kl"],
        "train/grad_norm": means["grad_norm"],
        "train/ratio_max": means["ratio_max"],
        "train/updates": up.n_updates,
        "train/skipped_steps": t.skipped_steps,
        "train/critic_only": float(up.critic_only),
        "loss/policy": means["policy_loss"],
        "loss/entropy": float(masked_mean(sc.entropy, mask)),
        "kl/ref": float(masked_mean(kl_estimate(sc.logprobs, sc.ref_logprobs, "k3"), mask)),
        "adv/mean": float(masked_mean(cr.advantages, mask)),
        "adv/std": float(masked_var(cr.advantages, mask).sqrt()),
        **episode_stats(batch.fresh, "rollout"),  # the new episodes (replayed ones excluded)
        "rollout/replayed": batch.replayed,
        "rollout/trained_episodes": traj.batch_size,
        "train/clip_eps": up.clip_eps,
        "train/ent_coef": up.ent_coef,
        "train/curriculum_level": t.curriculum.level,
        "train/kl_coef": cr.kl_coef,
        "envelope/ratio_skips": t.ratio_skips,
        **cr.envelope_row,
    }
    if t.trains_value:
        var_r = masked_var(cr.returns, mask)
        row["loss/value"] = means["value_loss"]
        row["loss/value_clipfrac"] = means["value_clipfrac"]
        row["train/explained_var"] = (
            float("nan")
            if float(var_r) == 0
            else float(1 - masked_var(cr.returns - sc.values, mask) / var_r)
        )
    for key, name in (
        ("kl_loss", "kl"),
        ("entropy_bonus", "entropy_bonus"),
        ("prior_kl", "prior_kl"),
    ):
        if key in means:
            row[f"loss/{name}"] = means[key]
    if t.anchor is not None:
        row["loss/sft_anchor"] = means["sft_anchor"]
        row["train/sft_coef"] = up.sft_coef
    if cr.energy is not None:
        row.update(t.credit.metrics(cr.energy, cr.weights, traj, iteration))
    return row


def perf_metrics(
    t: LMTrainer, traj: Trajectories, t_rollout: float, t_score: float, t_update: float
) -> dict[str, float]:
    """The iteration's ``perf/*`` row: seconds of each stage and tokens per second."""
    return {
        "perf/rollout_s": t_rollout,
        "perf/score_s": t_score,  # the no-gradient forward passes, inside update_s
        "perf/update_s": t_update,
        "perf/gen_tokens_per_s": int(traj.mask.sum()) / max(t_rollout, 1e-9),
        "perf/update_tokens_per_s": t.cfg.algo.epochs
        * int(traj.attention_mask.sum())
        / max(t_update, 1e-9),
        "perf/elapsed_s": time.perf_counter() - t.t_start,
    }


def evaluate_and_save(
    t: LMTrainer, iteration: int, row: dict[str, float], batch: Batch, sc: Scored, cr: Credit
) -> None:
    """Stage 5: average the row over processes, step the curriculum and the KL controller,
    evaluate every ``eval.every`` iterations (and at the last), log the row, write sampled
    trajectories and the checkpoint, report progress."""
    cfg, par, n_iters = t.cfg, t.par, t.cfg.algo.iterations
    n_fresh = batch.fresh.batch_size
    row = par.average_metrics(row, float(n_fresh))
    t.curriculum.after_iteration(row["rollout/success"])
    if t.kl_ctl is not None:
        t.kl_ctl.update(row["kl/ref"], n_fresh * par.world)
    last = iteration + 1 == n_iters
    if (iteration + 1) % cfg.eval.every == 0 or last:
        ev = evaluate(t.agent, cfg, par=par)
        if par.is_main:
            ev.update(_diagnose(t.agent, cfg, t.diag_gen, t.ref))
        row.update(ev)
        t.evals.append({"train/iteration": iteration + 1, **ev})
        t.credit.after_eval(ev["eval/success"])
        if cfg.eval.keep_best and t.run is not None and ev["eval/success"] > t.best_success:
            t.best_success = ev["eval/success"]
            _save_best(t.agent, t.run.path, iteration + 1, ev)
    t.history.append({"train/global_step": t.episodes_done, **row})
    if t.run is not None:
        t.run.log(t.episodes_done, row)
        if iteration % max(1, n_iters // 10) == 0 or last:
            _write_samples(
                t.run, iteration + 1, batch.traj, sc, cr.advantages, t.agent.tokenizer,
                cr.energy, cr.weights,
            )  # fmt: skip
        every = cfg.log.checkpoint_every
        if (every and (iteration + 1) % every == 0) or last:
            t.run.save_checkpoint(
                t.agent, iteration + 1, {"episodes": t.episodes_done}, t.state_dict(iteration + 1)
            )
    if t.progress is not None:
        t.progress(iteration + 2, n_iters + 1, t.episodes_done, row)

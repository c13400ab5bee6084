"""SFT → reward model → PPO for a small causal LM on synthetic text, inside a safety envelope.

The stages of one run (``tokenergy pipeline configs/slm-story.yaml``), after Haque, Islam and
Karray, *Towards Robust RL for Small-Scale LM Agents* (SMC 2026):

1. **Pre-training** of a randomly initialised causal LM (full weights) on the three synthetic
   domains mixed (:mod:`tokenergy.envs.corpora`); skipped when ``model.path`` names a pre-trained
   folder.
2. **SFT** with a LoRA adapter (``peft``) on the run's domain: ``prompt → continuation``, the
   loss on the continuation only.
3. **Merge-and-reinit**: the SFT adapter is merged into the weights; the merged model, frozen,
   is the reference; a fresh adapter on a copy of it is the PPO policy. (Reloading the saved
   SFT adapter the plain ``peft`` way instead, ``ppo.merge_reinit: false``, gives a frozen
   adapter: only the value head would learn. The run refuses to train such a policy and
   says so.)
4. A **Bradley–Terry reward model**: the pre-trained backbone with a scalar head on the last
   token, trained on preference pairs (:func:`tokenergy.envs.corpora.preference_pairs`) with
   ``-log σ(r_chosen - r_rejected)``.
5. **PPO** on continuations of training prompts: reward-model score on the last token, a
   per-token KL penalty to the reference (fixed or adaptive β), GAE with a value head, clipped
   value loss; the envelope: reward clip-and-whiten, ratio cap, rollback on non-finite steps,
   bf16 option.
6. **Evaluation** on held-out prompts, SFT against PPO: reward-model score mean ± std, Δ, the
   analytic win rate ``Φ(Δ / sqrt(σ²_SFT + σ²_PPO))``, perplexity of the held-out
   continuations, Distinct-1/2 of the samples; the reward model's pairwise accuracy.

Everything a run measures is in ``summary.json``; per-iteration metrics in ``metrics.jsonl``.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tokenergy.advantages import token_gae
from tokenergy.algos.update import Credit, update, update_optimizer
from tokenergy.config import PipelineRunConfig
from tokenergy.config.lm import AlgoConfig
from tokenergy.distributed import Parallel
from tokenergy.envs.corpora import (
    Doc,
    Pair,
    corpus_words,
    distinct_n,
    make_corpus,
    preference_pairs,
)
from tokenergy.envs.corpora import win_rate as analytic_win_rate
from tokenergy.losses import kl_estimate
from tokenergy.models.lm import AgentModel
from tokenergy.ops import masked_mean, whiten
from tokenergy.rollout import (
    Episode,
    Scored,
    Trajectories,
    collate,
    generate_turns,
    score,
    token_logprobs,
)
from tokenergy.runs import Run
from tokenergy.safety import AdaptiveKL, autocast, clip_whiten_rewards, params_are_finite
from tokenergy.types import Role

__all__ = [
    "PipelineResult",
    "RewardModel",
    "bradley_terry_loss",
    "merge_and_reinit",
    "run_pipeline",
]

ProgressFn = Callable[[int, int, int, dict[str, float]], None]

# Progress steps besides the PPO iterations: pre-training, SFT, reward model, evaluation.
EXTRA_STEPS = 4


@dataclass
class PipelineResult:
    summary: dict[str, float]
    history: list[dict[str, float]]
    policy: nn.Module  # the PPO policy (a peft model)
    reference: nn.Module  # the merged SFT model, frozen
    reward_model: RewardModel | None  # None after stop_after: pretrain
    run_dir: Path | None


# --------------------------------------------------------------------------- batches of text


def _encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad rows into ``(ids, attention_mask)``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = True
    return ids, attn


def _lm_batch(tok, docs: list[Doc], prompt_loss: bool) -> tuple[torch.Tensor, ...]:
    """``<bos> prompt continuation <eos>`` rows: ids, attention mask, loss mask (the
    continuation and ``<eos>``; every real token but ``<bos>`` with ``prompt_loss``)."""
    rows, masks = [], []
    for d in docs:
        p, c = _encode(tok, d.prompt), _encode(tok, d.continuation)
        rows.append([tok.bos_token_id, *p, *c, tok.eos_token_id])
        masks.append([0] + [int(prompt_loss)] * len(p) + [1] * (len(c) + 1))
    ids, attn = _pad(rows, tok.pad_token_id)
    loss_mask, _ = _pad(masks, 0)
    return ids, attn, loss_mask.bool()


def _nll(model: nn.Module, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor):
    """Token-mean negative log-likelihood over ``mask`` (position t predicted from t-1)."""
    logits = model(input_ids=ids, attention_mask=attn).logits
    return -masked_mean(token_logprobs(logits, ids), mask)


def _stage_optimizer(module: nn.Module, stage) -> Callable[[torch.Tensor], None]:
    """AdamW over the trainable weights, the learning rate decaying linearly to 0 over
    ``stage.steps``; returns the step: backward, clip at norm 1, update."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=stage.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - i / max(stage.steps, 1))

    def step(loss: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()

    return step


def _fit_lm(
    model: nn.Module,
    tok,
    docs: list[Doc],
    stage,
    prompt_loss: bool,
    gen: torch.Generator,
    device: torch.device,
    log: Callable[[dict[str, float]], None],
    prefix: str,
) -> None:
    """``stage.steps`` AdamW steps of next-token cross-entropy on random minibatches."""
    step_fn = _stage_optimizer(model, stage)
    model.train()
    for step in range(stage.steps):
        idx = torch.randint(len(docs), (stage.batch_size,), generator=gen).tolist()
        ids, attn, mask = (
            t.to(device) for t in _lm_batch(tok, [docs[i] for i in idx], prompt_loss)
        )
        loss = _nll(model, ids, attn, mask)
        step_fn(loss)
        if step % 10 == 0 or step == stage.steps - 1:
            log({f"{prefix}/loss": float(loss.detach()), f"{prefix}/step": step + 1})


@torch.no_grad()
def perplexity(model: nn.Module, tok, docs: list[Doc], device: torch.device, batch: int = 64):
    """``exp`` of the token-mean NLL of the continuations (and ``<eos>``) given the prompts."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(docs), batch):
        ids, attn, mask = (t.to(device) for t in _lm_batch(tok, docs[start : start + batch], False))
        logits = model(input_ids=ids, attention_mask=attn).logits
        lp = token_logprobs(logits, ids)
        total += float(-(lp * mask).sum())
        count += int(mask.sum())
    return math.exp(total / max(count, 1))


# --------------------------------------------------------------------------- reward model


class RewardModel(nn.Module):
    """A causal-LM backbone with a scalar head on the hidden state of the last real token."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:  # -> (B,)
        out = self.backbone(input_ids=ids, attention_mask=attn, output_hidden_states=True)
        hidden = out.hidden_states[-1]
        last = attn.long().sum(1) - 1
        return self.head(hidden[torch.arange(ids.shape[0]), last]).squeeze(-1)

    @torch.no_grad()
    def score_texts(self, tok, texts: list[str], device: torch.device, batch: int = 64):
        self.eval()
        out = []
        for start in range(0, len(texts), batch):
            rows = [
                [tok.bos_token_id, *_encode(tok, t), tok.eos_token_id]
                for t in texts[start : start + batch]
            ]
            ids, attn = _pad(rows, tok.pad_token_id)
            out.append(self(ids.to(device), attn.to(device)).float().cpu())
        return torch.cat(out)


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """``mean(-log σ(r_chosen - r_rejected))``: the Bradley–Terry negative log-likelihood."""
    return -nn.functional.logsigmoid(chosen - rejected).mean()


def _pair_batch(tok, pairs: list[Pair]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [
        [tok.bos_token_id, *_encode(tok, t), tok.eos_token_id]
        for p in pairs
        for t in (p.chosen, p.rejected)
    ]
    return _pad(rows, tok.pad_token_id)  # chosen rows even, rejected rows odd


def fit_reward_model(
    rm: RewardModel,
    tok,
    pairs: list[Pair],
    stage,
    gen: torch.Generator,
    device: torch.device,
    log: Callable[[dict[str, float]], None],
) -> None:
    step_fn = _stage_optimizer(rm, stage)
    rm.train()
    for step in range(stage.steps):
        idx = torch.randint(len(pairs), (stage.batch_size,), generator=gen).tolist()
        ids, attn = _pair_batch(tok, [pairs[i] for i in idx])
        r = rm(ids.to(device), attn.to(device))
        loss = bradley_terry_loss(r[0::2], r[1::2])
        step_fn(loss)
        if step % 10 == 0 or step == stage.steps - 1:
            acc = float((r[0::2] > r[1::2]).float().mean())
            log({"rm/loss": float(loss.detach()), "rm/train_accuracy": acc, "rm/step": step + 1})


@torch.no_grad()
def pairwise_accuracy(rm: RewardModel, tok, pairs: list[Pair], device: torch.device) -> dict:
    """Share of pairs the reward model orders right, overall and per corruption kind."""
    chosen = rm.score_texts(tok, [p.chosen for p in pairs], device)
    rejected = rm.score_texts(tok, [p.rejected for p in pairs], device)
    right = (chosen > rejected).float()
    out = {"rm/accuracy": float(right.mean())}
    for kind in sorted({p.kind for p in pairs}):
        sel = torch.tensor([p.kind == kind for p in pairs])
        out[f"rm/accuracy_{kind}"] = float(right[sel].mean())
    return out


# --------------------------------------------------------------------------- LoRA stages


def _lora(model: nn.Module, cfg: PipelineRunConfig) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.model.lora_r,
        lora_alpha=cfg.model.lora_alpha,
        target_modules=list(cfg.model.lora_targets),
        lora_dropout=0.0,  # PPO ratios need train == eval forward passes
    )
    return get_peft_model(model, lora)


def merge_and_reinit(sft_model: nn.Module, cfg: PipelineRunConfig) -> tuple[nn.Module, nn.Module]:
    """Merge the SFT adapter into the weights; return ``(policy, reference)``: a fresh LoRA
    adapter on a copy of the merged model, and the merged model itself, frozen."""
    merged = copy.deepcopy(sft_model).merge_and_unload()
    reference = merged.eval().requires_grad_(False)
    policy = _lora(copy.deepcopy(merged).requires_grad_(True), cfg)
    return policy, reference


def reload_sft_adapter(sft_model: nn.Module, folder: Path) -> tuple[nn.Module, nn.Module]:
    """The plain ``peft`` way to go on from SFT: save the adapter, load it back onto the base.

    ``PeftModel.from_pretrained`` loads adapters for inference (``is_trainable=False``): the
    returned policy has no trainable weight. Kept to show why the pipeline merges instead.
    """
    from peft import PeftModel

    sft_model.save_pretrained(str(folder))
    base = copy.deepcopy(sft_model).unload()  # the base weights, adapter layers removed
    policy = PeftModel.from_pretrained(base, str(folder))
    reference = copy.deepcopy(sft_model).merge_and_unload().eval().requires_grad_(False)
    return policy, reference


# --------------------------------------------------------------------------- PPO


def _continue(
    model: nn.Module,
    tok,
    prompts: list[str],
    max_new: int,
    temperature: float,
    gen: torch.Generator,
) -> tuple[list[list[int]], list[list[int]]]:
    """Sample continuations: ``(contexts, new tokens)``; a continuation ends at ``<eos>``."""
    contexts = [[tok.bos_token_id, *_encode(tok, p)] for p in prompts]
    model.eval()
    with torch.no_grad():
        new = generate_turns(
            model, contexts, {tok.eos_token_id}, tok.pad_token_id, max_new, temperature, 1.0, gen
        )
    return contexts, new


def _text(tok, ids: list[int]) -> str:
    return tok.decode([i for i in ids if i != tok.eos_token_id], skip_special_tokens=True)


@dataclass
class PPOLearner:
    """The pipeline's PPO as the shared update stage reads it
    (:class:`tokenergy.algos.update.Learner`): the agent (fresh LoRA adapter and value head),
    AdamW over both, the update's settings from ``ppo`` and ``envelope``, and the counters of
    skipped steps. The KL to the reference is a reward here, so the loss never reads it."""

    agent: AgentModel
    opt: torch.optim.Optimizer
    params: list[nn.Parameter]
    algo: AlgoConfig
    gen: torch.Generator
    device: torch.device
    rollback: bool
    ref: nn.Module | None = None
    clip_apart: None = None
    par: Parallel = field(default_factory=Parallel)
    target_head: None = None
    anchor: None = None
    reuse_logprobs: bool = False
    prior_tau: float = 1.0
    trains_value: bool = True
    ratio_skips: int = 0
    skipped_steps: int = 0


def _learner(agent: AgentModel, cfg: PipelineRunConfig, gen, device) -> PPOLearner:
    """AdamW over the fresh adapter (``ppo.lr``) and the value head (``ppo.value_lr``), and the
    update's settings: PPO with a clipped value loss, the KL a ``k1`` reward, no entropy bonus,
    no warm-up or schedule, the envelope's ratio cap, precision and rollback."""
    p, env = cfg.ppo, cfg.envelope
    opt, policy_params, head_params = update_optimizer(agent, p.lr, p.value_lr)
    if not policy_params:
        raise ValueError(
            "PPO: the policy has no trainable weight (a reloaded peft adapter is frozen); only "
            "the value head would learn. Keep ppo.merge_reinit: true"
        )
    algo = AlgoConfig(
        name="ppo", iterations=p.iterations, lr=p.lr, value_lr=p.value_lr, epochs=p.epochs,
        minibatches=p.minibatches, clip_eps=p.clip_eps, value_clip=p.value_clip,
        vf_coef=p.vf_coef, gamma=p.gamma, lam=p.lam, kl_coef=p.kl_coef, kl_kind="k1",
        kl_in="reward", kl_target=p.kl_target, kl_horizon=p.kl_horizon,
        max_grad_norm=p.max_grad_norm, ratio_cap=env.ratio_cap, precision=env.precision,
        reward_whiten=env.reward_whiten, reward_clip=env.reward_clip,
    )  # fmt: skip
    return PPOLearner(agent, opt, policy_params + head_params, algo, gen, device, env.rollback)


def _collect(
    agent: AgentModel, tok, docs: list[Doc], cfg: PipelineRunConfig, gen, rng
) -> Trajectories:
    """Stage 1: continue ``ppo.prompts`` training prompts drawn with ``rng``, sampling with
    ``gen``. A continuation is an episode of one turn: the prompt is its observation, the
    continuation its trained (action) tokens; its reward comes from the reward model."""
    picks = rng.integers(len(docs), size=cfg.ppo.prompts)
    prompts = [docs[int(i)].prompt for i in picks]
    p = cfg.ppo
    contexts, new = _continue(agent.policy, tok, prompts, p.max_new_tokens, p.temperature, gen)
    agent.eval()
    episodes = [
        Episode(tokens=c + n, roles=[int(Role.OBSERVATION)] * len(c) + [int(Role.ACTION)] * len(n),
                rewards=[0.0] * (len(c) + len(n)), terminated=True, turns=1)
        for c, n in zip(contexts, new, strict=True)
    ]  # fmt: skip
    return collate(episodes, tok.pad_token_id)


def _reward_scores(rm: RewardModel, tok, traj: Trajectories, device) -> torch.Tensor:
    """The reward model's score of each prompt + continuation + ``<eos>`` (as in its pairs)."""
    rows = [e.tokens for e in traj.episodes]
    rm_ids, rm_attn = _pad(
        [r if r[-1] == tok.eos_token_id else [*r, tok.eos_token_id] for r in rows],
        tok.pad_token_id,
    )
    return rm(rm_ids.to(device), rm_attn.to(device)).float().cpu()


def _assign_credit(
    traj: Trajectories, sc: Scored, scores: torch.Tensor, kl_coef: float, cfg: PipelineRunConfig
) -> Credit:
    """Stage 3: the score on each continuation's last token (clipped and whitened over the
    batch with the envelope), minus ``kl_coef`` times the per-token KL (``k1``) to the
    reference; GAE with the value head; advantages whitened over the continuations' tokens."""
    p, env, mask = cfg.ppo, cfg.envelope, traj.mask
    kl_tok = kl_estimate(sc.logprobs, sc.ref_logprobs, "k1") * mask
    at_end = torch.zeros_like(mask)
    at_end[torch.arange(traj.batch_size), traj.last_index] = True
    at_end &= mask  # an empty continuation earns nothing
    env_rewards = scores[:, None] * at_end
    row: dict[str, float] = {}
    if env.reward_whiten:
        env_rewards, frac = clip_whiten_rewards(env_rewards, at_end, env.reward_clip)
        row["envelope/reward_clipped"] = frac
    rewards = env_rewards - kl_coef * kl_tok
    adv, returns = token_gae(
        rewards, sc.values, mask, traj.terminated, sc.values.new_zeros(traj.batch_size),
        p.gamma, p.lam,
    )  # fmt: skip
    return Credit(adv, whiten(adv, mask), returns, None, None, kl_coef, 0.0, row)


def _ppo(
    agent: AgentModel,
    reference: nn.Module,
    rm: RewardModel,
    tok,
    docs: list[Doc],
    cfg: PipelineRunConfig,
    gen: torch.Generator,
    rng: np.random.Generator,
    device: torch.device,
    log: Callable[[int, dict[str, float]], None],
    tick: Callable[[dict[str, float]], None],
) -> list[dict[str, float]]:
    """``ppo.iterations`` iterations of collect → score → credit → update, the last stage the
    LM trainer's own (:func:`tokenergy.algos.update.update`); one metrics row each."""
    p = cfg.ppo
    learner = _learner(agent, cfg, gen, device)
    kl_ctl = AdaptiveKL(p.kl_coef, p.kl_target, p.kl_horizon) if p.kl_target else None
    history: list[dict[str, float]] = []
    for it in range(p.iterations):
        t0 = time.perf_counter()
        traj = _collect(agent, tok, docs, cfg, gen, rng)
        t_rollout = time.perf_counter() - t0
        t1 = time.perf_counter()
        with autocast(device, cfg.envelope.precision):
            sc = score(agent, reference, traj)
            scores = _reward_scores(rm, tok, traj, device)
        sc.values = sc.values * traj.mask
        beta = kl_ctl.value if kl_ctl is not None else p.kl_coef
        cr = _assign_credit(traj, sc, scores, beta, cfg)
        up = update(learner, traj, sc, cr, it)
        kl_mean = float(masked_mean(kl_estimate(sc.logprobs, sc.ref_logprobs, "k3"), traj.mask))
        if kl_ctl is not None:
            kl_ctl.update(kl_mean, traj.batch_size)
        row = _ppo_row(it, traj, sc, cr, up, scores, kl_mean, learner)
        row.update({"perf/rollout_s": t_rollout, "perf/update_s": time.perf_counter() - t1})
        history.append(row)
        log(it + 1, row)
        tick(row)
        if not row["ppo/weights_finite"]:  # only without the rollback: training has collapsed
            break
    return history


def _ppo_row(it, traj, sc, cr, up, scores, kl_mean, learner: PPOLearner) -> dict[str, float]:
    """The iteration's metrics row (docs/metrics.md, ``ppo/*`` and ``envelope/*``)."""
    lengths = traj.mask.sum(1).float()
    return {
        **cr.envelope_row,
        "ppo/iteration": it + 1,
        "ppo/score": float(scores.mean()),
        "ppo/score_std": float(scores.std()),
        "ppo/length": float(lengths.mean()),
        "ppo/kl_ref": kl_mean,
        "ppo/kl_coef": cr.kl_coef,
        "ppo/entropy": float(-masked_mean(sc.logprobs, traj.mask)),
        "ppo/clipfrac": up.means["clipfrac"],
        "ppo/approx_kl": up.means["approx_kl"],
        "ppo/value_loss": up.means["value_loss"],
        "ppo/grad_norm": up.means["grad_norm"],
        "ppo/updates": up.n_updates,
        "ppo/weights_finite": float(params_are_finite(learner.agent)),
        "envelope/ratio_skips": learner.ratio_skips,
        "envelope/rollbacks": learner.skipped_steps,
    }


# --------------------------------------------------------------------------- the run


def _build_lm(cfg: PipelineRunConfig, tok) -> nn.Module:
    from transformers import AutoModelForCausalLM

    from tokenergy.models.lm import _config, _quiet_transformers

    if cfg.model.path:
        _quiet_transformers()
        return AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32)
    config = _config("llama", cfg.model.size, len(tok), tok, max_positions=256)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return AutoModelForCausalLM.from_config(config)


def pipeline_tokenizer():
    """The word-level tokenizer over the corpora's words (and the envs', which it shares)."""
    from tokenergy.models.tokenizer import build_tokenizer

    return build_tokenizer(corpus_words())


def _evaluate(
    policy: nn.Module,
    reference: nn.Module,
    rm: RewardModel,
    tok,
    held: list[Doc],
    cfg: PipelineRunConfig,
    device: torch.device,
) -> tuple[dict[str, float], list[dict[str, str]]]:
    e = cfg.eval
    docs = held[: e.prompts]
    prompts = [d.prompt for d in docs]
    out: dict[str, float] = {}
    samples: list[dict[str, str]] = [{"prompt": pr} for pr in prompts[:8]]
    for name, model in (("sft", reference), ("ppo", policy)):
        gen = torch.Generator().manual_seed(cfg.seed + 99)  # the same draws for both models
        _, new = _continue(model, tok, prompts, cfg.ppo.max_new_tokens, e.temperature, gen)
        texts = [_text(tok, n) for n in new]
        scores = rm.score_texts(
            tok, [f"{pr} {t}" for pr, t in zip(prompts, texts, strict=True)], device
        )
        out[f"{name}/score_mean"] = float(scores.mean())
        out[f"{name}/score_std"] = float(scores.std())
        out[f"{name}/perplexity"] = perplexity(model, tok, docs, device)
        out[f"{name}/distinct1"] = distinct_n(texts, 1)
        out[f"{name}/distinct2"] = distinct_n(texts, 2)
        out[f"{name}/length"] = float(np.mean([len(n) for n in new]))
        for s, t in zip(samples, texts, strict=False):
            s[name] = t
    delta = out["ppo/score_mean"] - out["sft/score_mean"]
    out["delta"] = delta
    out["win_rate"] = analytic_win_rate(delta, out["sft/score_std"], out["ppo/score_std"])
    return out, samples


def run_pipeline(
    cfg: PipelineRunConfig,
    run: Run | None = None,
    progress: ProgressFn | None = None,
) -> PipelineResult:
    """Every stage of one run (module docstring); ``summary.json`` in ``run`` at the end."""
    from tokenergy.algos.ppo import resolve_device
    from tokenergy.models.lm import _quiet_transformers

    _quiet_transformers()
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    rng = np.random.default_rng(cfg.seed)
    total = cfg.ppo.iterations + EXTRA_STEPS
    done = {"n": 0}
    t_start = time.perf_counter()

    def log(step: int, row: dict[str, float]) -> None:
        if run is not None:
            run.log(step, row)

    def tick(row: dict[str, float]) -> None:
        done["n"] += 1
        if progress is not None:
            progress(done["n"], total, done["n"], row)

    tok = pipeline_tokenizer()
    c = cfg.corpus
    train = make_corpus(c.domain, c.train_docs, cfg.seed)
    held = make_corpus(c.domain, c.heldout_docs, cfg.seed + 1_000_003)
    summary: dict[str, float] = {}

    # 1. pre-training ----------------------------------------------------------------------
    base = _build_lm(cfg, tok).to(device)
    if cfg.model.path is None and cfg.pretrain.steps > 0:
        mixed = [
            d
            for dom in ("story", "news", "facts")
            for d in make_corpus(dom, c.pretrain_docs, cfg.seed + 7)
        ]
        _fit_lm(base, tok, mixed, cfg.pretrain, True, gen, device, lambda r: log(0, r), "pretrain")
        if run is not None:
            base.save_pretrained(str(run.path / "pretrained"))
            tok.save_pretrained(str(run.path / "pretrained"))
    summary["pretrain/perplexity"] = perplexity(base, tok, held, device)
    if cfg.stop_after == "pretrain":
        if run is not None:
            (run.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        tick(summary)
        return PipelineResult(summary, [], base, base, None, run.path if run else None)
    tick({})

    # 2. SFT with LoRA ------------------------------------------------------------------------
    sft_model = _lora(copy.deepcopy(base), cfg).to(device)
    _fit_lm(sft_model, tok, train, cfg.sft, False, gen, device, lambda r: log(0, r), "sft")
    tick({})

    # 3. merge-and-reinit ---------------------------------------------------------------------
    if cfg.ppo.merge_reinit:
        policy, reference = merge_and_reinit(sft_model, cfg)
    else:
        folder = (run.path if run is not None else Path.cwd()) / "sft_adapter"
        policy, reference = reload_sft_adapter(sft_model, folder)
    policy, reference = policy.to(device), reference.to(device)

    # 4. reward model -------------------------------------------------------------------------
    rm = RewardModel(copy.deepcopy(base)).to(device)
    pairs = preference_pairs(train, seed=cfg.seed + 11)
    fit_reward_model(rm, tok, pairs, cfg.rm, gen, device, lambda r: log(0, r))
    held_pairs = preference_pairs(held, seed=cfg.seed + 13)[: cfg.eval.pairs]
    summary.update(pairwise_accuracy(rm, tok, held_pairs, device))
    rm.requires_grad_(False).eval()
    tick(summary)

    # 5. PPO ----------------------------------------------------------------------------------
    agent = AgentModel(policy, tok).to(device)
    history = _ppo(agent, reference, rm, tok, train, cfg, gen, rng, device, log, tick)

    # 6. evaluation ---------------------------------------------------------------------------
    collapsed = not params_are_finite(agent)
    if collapsed:  # non-finite weights cannot sample: the SFT side alone, PPO's left NaN
        ev, samples = _evaluate(reference, reference, rm, tok, held, cfg, device)
        for k in list(ev):
            if k.startswith("ppo/") or k in ("delta", "win_rate"):
                ev[k] = float("nan")
    else:
        ev, samples = _evaluate(agent.policy, reference, rm, tok, held, cfg, device)
    summary.update(ev)
    summary["ppo/collapsed"] = float(collapsed)
    summary["ppo/iterations_done"] = len(history)
    if history:
        summary["envelope/ratio_skips"] = history[-1]["envelope/ratio_skips"]
        summary["envelope/rollbacks"] = history[-1]["envelope/rollbacks"]
        summary["ppo/weights_finite"] = history[-1]["ppo/weights_finite"]
    summary["perf/elapsed_s"] = time.perf_counter() - t_start
    log(cfg.ppo.iterations + 1, summary)
    if run is not None:
        (run.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        with open(run.path / "samples.jsonl", "w") as f:
            for s in samples:
                f.write(json.dumps(s) + "\n")
    tick(summary)
    return PipelineResult(summary, history, agent.policy, reference, rm, run.path if run else None)


def summary_of(run_dir: str | Path) -> dict[str, Any]:
    """A finished run's ``summary.json``."""
    return json.loads((Path(run_dir) / "summary.json").read_text())


def total_steps(cfg: PipelineRunConfig) -> int:
    """Progress steps of a run: one with ``stop_after: pretrain``."""
    return 1 if cfg.stop_after == "pretrain" else cfg.ppo.iterations + EXTRA_STEPS

"""Learning to search: a one-layer attention-only transformer trained by REINFORCE on the
``tree_search`` task (Yang, Huang, Liang, Chi, arXiv:2606.00183).

**The task, as tokens.** A batch of episodes runs in torch, with the rules of
:class:`tokenergy.envs.tree_search.TreeSearchText`: a full ``k``-ary tree of ``depth``
levels, a hidden goal leaf, each move picks a child; a non-goal leaf appends ``FAIL`` and the
next move starts again at the root; the goal ends the episode with reward ``gamma ** t``
(``t`` the 0-based index of the move); a budget of leaf visits. The sequence the policy reads
is ``BOS``, then one token per move (the child, ``0 … k-1``) and a ``FAIL`` token after each
failed leaf; the decision of position ``t`` is the next move, at depth ``j`` (moves since the
last ``FAIL``, plus one).

**The model** (:class:`SearchTransformer`): one attention layer, ``heads`` heads, no MLP, one
query per decision. Each key token ``x`` is its one-hot token (a child, ``FAIL`` or ``BOS``)
and its one-hot depth. Head ``h`` scores a key by

``s_h(key) = u_h · onehot(token) + e_h · onehot(depth) + b_h[relation] - r_h · attempts_ago``

where ``relation`` places the key relative to the decision (``BOS``, ``FAIL``, *shallower*,
*same depth*, *deeper*), ``attempts_ago`` counts the ``FAIL`` tokens between key and decision
(``BOS`` has none), ``r_h = softplus(ρ_h)`` is a learned recency rate. The logits over the
``k`` children are ``Σ_h Σ_key softmax(s_h)_key · V_h[relation(key), token(key)] + c``: a
key's vote is read from the one-hot of its token paired with its relation. The depth embedding
``e_h`` starts at zero, so depths never seen in training add nothing: what carries to deeper
trees are the relations, the recency and the token values (``model.depth_embedding: false``
keeps it at zero; ``model.window: n`` lets attention read only the last ``n`` attempts;
``model.depth_features`` adds a score of the key's depth relative to the decision's that is
shared across depths, :class:`SearchTransformer`).

**Why two heads suffice** (a construction, tested in ``tests/test_dfs.py``): with children
ordered ``0 … k-1``, head 1 attends to the previous attempt's move at the same depth ``p_j``
and votes ``-λ·c - M₂·[c < p_j]`` (stay on ``p_j``, never go back); head 2 attends to the
previous attempt's moves at depths ``≥ j`` that were *not* the last child (``k-1``), falling
back on all of them when there are none; the same-depth move votes ``-M·e(p_j)``, a deeper
last child ``-M·e(k-1)``, a deeper other child nothing. When every deeper move of the previous
attempt was a last child (the "carry"), head 2 sees ``p_j`` alone and pushes the choice to
``p_j + 1``, or, when ``p_j`` was last too, sees only last children and sends the choice back to
``0``; otherwise ``p_j`` shares head 2 with at least one deeper token and keeps its lead
(``λ < M < 2λ``). The result is depth-first search in
the children's order, at any depth: :func:`dfs_weights` sets those weights by hand.

**Training** (:func:`train_dfs`): REINFORCE with the batch-mean baseline (per depth), an
entropy bonus, Adam with a learning-rate share per parameter block (``train.block_lr``); a
depth curriculum (depth 1, then 2, ...), optionally training only some heads in each stage
(``train.stage_heads``). What it learns from depths 1
and 2 is not this construction (docs/results/search.md): the trained heads count earlier
tries at the decision's depth, which does not carry to deeper trees.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tokenergy.config.dfs import DEPTH_FEATURES
from tokenergy.envs.tree_search import branch_probs

__all__ = [
    "SearchTransformer",
    "TreeBatch",
    "ablation_table",
    "dfs_weights",
    "evaluate_search",
    "random_dfs_leaves",
    "random_moves_leaves",
    "random_moves_success",
    "train_dfs",
]

N_REL = 5  # BOS, FAIL, shallower, same depth, deeper
REL_BOS, REL_FAIL, REL_SHALLOW, REL_SAME, REL_DEEP = range(N_REL)


# --------------------------------------------------------------------------- the task


class TreeBatch:
    """``B`` tree searches stepped together; the token sequences the policy reads.

    Tokens: ``0 … k-1`` children, ``k`` = ``FAIL``, ``k + 1`` = ``BOS``. Per position the
    batch keeps the token, its depth (1 … depth for moves, 0 for ``BOS``, ``depth + 1`` for
    ``FAIL``) and its attempt index (``FAIL`` tokens before it).
    """

    def __init__(
        self,
        k: int,
        depth: int,
        batch: int,
        goal: str = "uniform",
        zipf_s: float = 1.0,
        gamma: float = 1.0,
        budget: int | None = None,
        generator: torch.Generator | None = None,
        goals: torch.Tensor | None = None,
    ) -> None:
        self.k, self.depth, self.B, self.gamma = k, depth, batch, gamma
        self.budget = k**depth if budget is None else budget
        self.FAIL, self.BOS = k, k + 1
        if goals is None:
            p = torch.as_tensor(branch_probs(k, goal, zipf_s), dtype=torch.float)
            goals = torch.multinomial(p.expand(batch * depth, k), 1, generator=generator)
            goals = goals.view(batch, depth)
        self.goals = goals  # (B, depth)
        self.T = 1 + self.budget * (depth + 1)  # longest sequence
        self.tokens = torch.full((batch, self.T), self.BOS, dtype=torch.long)
        self.depths = torch.zeros(batch, self.T, dtype=torch.long)
        self.attempts = torch.zeros(batch, self.T, dtype=torch.long)
        self.length = torch.ones(batch, dtype=torch.long)  # tokens so far (BOS)
        self.path = torch.zeros(batch, depth, dtype=torch.long)
        self.level = torch.zeros(batch, dtype=torch.long)  # moves made in this attempt
        self.attempt = torch.zeros(batch, dtype=torch.long)
        self.moves = torch.zeros(batch, dtype=torch.long)
        self.done = torch.zeros(batch, dtype=torch.bool)
        self.found = torch.zeros(batch, dtype=torch.bool)
        self.reward = torch.zeros(batch)
        self.leaves: list[list[tuple[int, ...]]] = [[] for _ in range(batch)]

    def decision_depth(self) -> torch.Tensor:
        return self.level + 1

    def _push(self, rows: torch.Tensor, token: torch.Tensor, depth: torch.Tensor) -> None:
        pos = self.length[rows]
        self.tokens[rows, pos] = token
        self.depths[rows, pos] = depth
        self.attempts[rows, pos] = self.attempt[rows]
        self.length[rows] += 1

    def step(self, action: torch.Tensor) -> None:
        """Apply one move (a child index) in every unfinished episode."""
        live = (~self.done).nonzero().squeeze(-1)
        if live.numel() == 0:
            return
        a = action[live]
        self._push(live, a, self.level[live] + 1)
        self.path[live, self.level[live]] = a
        self.level[live] += 1
        self.moves[live] += 1
        at_leaf = live[self.level[live] == self.depth]
        if at_leaf.numel():
            hit = (self.path[at_leaf] == self.goals[at_leaf]).all(1)
            for i, row in enumerate(at_leaf.tolist()):
                self.leaves[row].append(tuple(self.path[row].tolist()))
                if hit[i]:
                    self.found[row] = True
                    self.done[row] = True
                    self.reward[row] = self.gamma ** (int(self.moves[row]) - 1)
            failed = at_leaf[~hit]
            if failed.numel():
                self._push(
                    failed,
                    torch.full_like(failed, self.FAIL),
                    torch.full_like(failed, self.depth + 1),
                )
                self.attempt[failed] += 1
                self.level[failed] = 0
                spent = failed[self.attempt[failed] >= self.budget]
                self.done[spent] = True

    @property
    def all_done(self) -> bool:
        return bool(self.done.all())


def random_dfs_leaves(k: int, depth: int) -> float:
    """Mean leaves a randomized DFS visits until a uniform goal: ``(k**depth + 1) / 2``."""
    return (k**depth + 1) / 2


def random_moves_success(k: int, depth: int) -> float:
    """Success of uniformly random moves within the budget of ``k**depth`` leaf visits: each
    visit hits the goal with ``q = k**-depth`` whatever the goal's distribution, so
    ``1 - (1 - q) ** k**depth`` (about ``1 - 1/e`` for deep trees)."""
    q = float(k) ** -depth
    return 1.0 - (1.0 - q) ** (k**depth)


def random_moves_leaves(k: int, depth: int) -> float:
    """Mean leaves uniformly random moves visit, stopping at the goal or the budget:
    ``sum_{i < k**depth} (1 - q) ** i = random_moves_success / q``."""
    return random_moves_success(k, depth) * float(k) ** depth


# --------------------------------------------------------------------------- the model


N_SINES = 4  # frequencies of the sinusoidal depth features


class SearchTransformer(nn.Module):
    """One attention layer, ``heads`` heads, no MLP (module docstring).

    ``depth_features`` adds a key score from the key's depth relative to the decision's,
    ``delta = depth(key) - depth(decision)`` for moves (0 for ``FAIL`` and ``BOS``), that is
    shared across depths: ``relative`` a learned slope per head, ``slope_h * delta``;
    ``sinusoidal`` a learned projection per head of ``sin`` and ``cos`` of ``delta`` at
    :data:`N_SINES` frequencies. Both start at zero. ``recency_init`` is the initial ``ρ``
    (the rate ``softplus(ρ)`` per attempt ago); ``block_init`` the initial std of a block
    (``u``, ``b``, ``values``) in place of ``init_scale``.
    """

    def __init__(
        self,
        k: int,
        heads: int = 2,
        max_depth: int = 16,
        init_scale: float = 0.1,
        seed: int = 0,
        window: int | None = None,
        depth_features: str = "none",
        recency_init: float = 0.0,
        block_init: dict[str, float] | None = None,
    ):
        super().__init__()
        if depth_features not in DEPTH_FEATURES:
            raise ValueError(
                f"depth_features must be one of {DEPTH_FEATURES}, got {depth_features!r}"
            )
        self.k, self.heads, self.max_depth, self.window = k, heads, max_depth, window
        self.depth_features = depth_features
        n_tok = k + 2
        g = torch.Generator().manual_seed(seed)
        scale = {"u": init_scale, "b": init_scale, "values": init_scale, **(block_init or {})}

        def p(name, *shape):
            return nn.Parameter(scale[name] * torch.randn(*shape, generator=g))

        self.u = p("u", heads, n_tok)  # key score of each token
        self.e = nn.Parameter(torch.zeros(heads, max_depth + 2))  # key score of each depth
        self.b = p("b", heads, N_REL)  # key score of each relation to the decision
        self.rho = nn.Parameter(torch.full((heads,), float(recency_init)))  # recency, softplus
        self.values = p("values", heads, N_REL, n_tok, k)  # a key's vote: by token and relation
        self.bias = nn.Parameter(torch.zeros(k))
        if depth_features == "relative":
            self.slope = nn.Parameter(torch.zeros(heads))
        elif depth_features == "sinusoidal":
            self.sines = nn.Parameter(torch.zeros(heads, 2 * N_SINES))

    def depth_score(self, tokens: torch.Tensor, depths: torch.Tensor, q_depth: torch.Tensor):
        """``[B, H, Q, T]`` key score of the key's depth relative to the decision's (0 without
        ``depth_features``)."""
        is_move = (tokens < self.k)[:, None, :]  # (B, 1, T)
        delta = torch.where(is_move, depths[:, None, :] - q_depth[:, :, None], 0).float()
        if self.depth_features == "relative":
            return self.slope[None, :, None, None] * delta[:, None]
        freq = 2.0 ** -torch.arange(N_SINES, dtype=torch.float)  # 1, 1/2, 1/4, 1/8 rad a level
        angle = delta[..., None] * freq  # (B, Q, T, F)
        feats = torch.cat([torch.sin(angle), torch.cos(angle) * is_move[..., None]], -1)
        return torch.einsum("bqtf,hf->bhqt", feats, self.sines)

    def relations(self, depths: torch.Tensor, tokens: torch.Tensor, query_depth: torch.Tensor):
        """``[..., T]`` relation of each key to a decision at ``query_depth`` (``[..., 1]``)."""
        rel = torch.where(
            depths < query_depth,
            REL_SHALLOW,
            torch.where(depths == query_depth, REL_SAME, REL_DEEP),
        )
        rel = torch.where(tokens == self.k, REL_FAIL, rel)
        return torch.where(tokens == self.k + 1, REL_BOS, rel)

    def scores(self, tokens, depths, attempts, q_depth, q_attempt):
        """``[B, H, Q, T]`` attention scores of keys ``[B, T]`` for decisions ``[B, Q]``."""
        rel = self.relations(depths[:, None, :], tokens[:, None, :], q_depth[:, :, None])
        ago = (q_attempt[:, :, None] - attempts[:, None, :]).clamp(min=0).float()
        ago = torch.where(tokens[:, None, :] == self.k + 1, 0.0, ago)  # BOS: no recency
        rate = nn.functional.softplus(self.rho)
        # the depth embedding's row: moves by depth, FAIL its own row (never a move's depth)
        slot = torch.where(tokens == self.k, self.max_depth + 1, depths.clamp(max=self.max_depth))
        s = (
            self.u[:, tokens].permute(1, 0, 2)[:, :, None, :]  # (B, H, 1, T)
            + self.e[:, slot].permute(1, 0, 2)[:, :, None, :]
            + self.b[:, rel].permute(1, 0, 2, 3)  # (B, H, Q, T)
            - rate[None, :, None, None] * ago[:, None]
        )
        if self.depth_features != "none":
            s = s + self.depth_score(tokens, depths, q_depth)
        return s

    def forward(self, tokens, depths, attempts, q_pos, q_depth, q_attempt, return_attn=False):
        """Logits ``[B, Q, k]`` of the decisions after positions ``q_pos`` ``[B, Q]`` (keys are
        the positions ``<= q_pos``)."""
        s = self.scores(tokens, depths, attempts, q_depth, q_attempt)
        T = tokens.shape[1]
        visible = torch.arange(T)[None, None, :] <= q_pos[:, :, None]  # (B, Q, T)
        if self.window is not None:  # keys of the last `window` attempts (and BOS) only
            ago = q_attempt[:, :, None] - attempts[:, None, :]
            visible &= (ago <= self.window) | (tokens[:, None, :] == self.k + 1)
        s = s.masked_fill(~visible[:, None], float("-inf"))
        attn = torch.softmax(s, -1)  # (B, H, Q, T)
        rel = self.relations(depths[:, None, :], tokens[:, None, :], q_depth[:, :, None])
        votes = self.values[:, rel, tokens[:, None, :].expand_as(rel)]  # (H, B, Q, T, k)
        logits = torch.einsum("bhqt,hbqtk->bqk", attn, votes) + self.bias
        return (logits, attn) if return_attn else logits


def dfs_weights(model: SearchTransformer, lam: float = 1.0, big: float = 30.0) -> None:
    """Set a two-head model (or more: the rest silenced) to depth-first search in the
    children's order (module docstring)."""
    if model.heads < 2:
        raise ValueError("dfs_weights: the construction needs two heads")
    k = model.k
    BOS = k + 1
    M = 1.5 * lam
    M2 = lam * (k - 1) + 1.1 * lam
    idx = torch.arange(k, dtype=torch.float)
    with torch.no_grad():
        for prm in model.parameters():
            prm.zero_()
        model.rho.fill_(-big)  # heads beyond the second: no effect (values 0)
        # head 0: the previous attempt's move at the same depth (score -big); BOS (-2 big)
        # only in the first attempt; everything else far below
        model.b[0] = torch.tensor([-2 * big, -10 * big, -10 * big, big, -10 * big])
        model.rho[0] = math.log(math.expm1(2 * big))  # softplus^-1: 2 big per attempt
        for c in range(k):
            model.values[0, REL_SAME, c] = -lam * idx - M2 * (idx < c).float()
        model.values[0, REL_BOS, BOS] = -lam * idx  # the first attempt: 0, 0, ..., 0
        # head 1: the previous attempt's moves at depths >= j (score -3 big), a last child
        # one big lower; BOS (value 0) only in the first attempt
        model.b[1] = torch.tensor([-9 * big, -10 * big, -10 * big, 0.0, 0.0])
        model.rho[1] = math.log(math.expm1(3 * big))
        model.u[1, k - 1] = -big
        for c in range(k):
            model.values[1, REL_SAME, c, c] = -M
        model.values[1, REL_DEEP, k - 1, k - 1] = -M  # a deeper last child: the wrap case


# --------------------------------------------------------------------------- rollouts


def _decide(model: SearchTransformer, env: TreeBatch, rows: torch.Tensor, greedy: bool, gen):
    """Sample (or take the argmax of) the next move of episodes ``rows``; also the log-prob."""
    L = int(env.length[rows].max())
    tokens, depths, attempts = env.tokens[rows, :L], env.depths[rows, :L], env.attempts[rows, :L]
    q_pos = (env.length[rows] - 1)[:, None]
    logits = model(tokens, depths, attempts, q_pos, env.decision_depth()[rows][:, None],
                   env.attempt[rows][:, None])[:, 0]  # fmt: skip
    if greedy:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(-1)


@torch.no_grad()
def play(
    model: SearchTransformer,
    k: int,
    depth: int,
    episodes: int,
    gen: torch.Generator,
    greedy: bool = False,
    **tree_kwargs: Any,
) -> TreeBatch:
    env = TreeBatch(k, depth, episodes, generator=gen, **tree_kwargs)
    while not env.all_done:
        live = (~env.done).nonzero().squeeze(-1)
        action = torch.zeros(episodes, dtype=torch.long)
        action[live] = _decide(model, env, live, greedy, gen)
        env.step(action)
    return env


def _decision_positions(env: TreeBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """For each episode the positions after which a move was decided (all but ``FAIL``-ended
    and the last), as ``[B, N]`` with ``-1`` padding, and the moves decided there."""
    B, T = env.tokens.shape
    is_move = (env.tokens < env.k) & (torch.arange(T)[None] < env.length[:, None])
    n = int(is_move.sum(1).max())
    pos = torch.full((B, n), -1, dtype=torch.long)
    for b in range(B):
        idx = is_move[b].nonzero().squeeze(-1)
        pos[b, : idx.numel()] = idx - 1  # a move at t was decided after position t - 1
    return pos, is_move


def log_probs(
    model: SearchTransformer, env: TreeBatch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probability and entropy of every move of a finished batch, ``[B, N]``, and its mask."""
    pos, _ = _decision_positions(env)
    valid = pos >= 0
    q_pos = pos.clamp(min=0)
    moves = env.tokens.gather(1, q_pos + 1)
    q_depth = env.depths.gather(1, q_pos + 1)
    q_attempt = env.attempts.gather(1, q_pos + 1)
    L = int(env.length.max())
    logits = model(
        env.tokens[:, :L], env.depths[:, :L], env.attempts[:, :L], q_pos, q_depth, q_attempt
    )
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, moves.clamp(max=env.k - 1)[..., None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp * valid, ent * valid, valid


# --------------------------------------------------------------------------- training


@dataclass
class DFSResult:
    model: SearchTransformer
    history: list[dict[str, float]]


@contextlib.contextmanager
def deterministic_kernels():
    """PyTorch's deterministic kernels for the duration (the previous setting is restored).

    With more than one CPU thread the gradient of :class:`SearchTransformer`'s value table
    (an indexed read, whose backward accumulates into repeated indices) is summed in an
    order that changes from call to call; over a thousand REINFORCE steps the last-digit
    differences grow into different trained models (35 points of depth-4 success between
    two runs of one seed). The deterministic kernel sums in a fixed order.
    """
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def train_dfs(
    cfg,
    run=None,
    progress: Callable[[int, int, int, dict[str, float]], None] | None = None,
) -> DFSResult:
    """REINFORCE with a batch-mean baseline over a depth curriculum (``cfg.train``); the same
    seed gives the same run (:func:`deterministic_kernels`)."""
    with deterministic_kernels():
        return _train_dfs(cfg, run, progress)


def training_budget(k: int, depth: int, frac: float | None) -> int | None:
    """The leaf budget of a training tree: ``ceil(frac * k**depth)`` leaves, at least one;
    ``None`` (all ``k**depth``) without ``frac``."""
    return None if frac is None else max(1, math.ceil(frac * k**depth))


def _train_dfs(cfg, run, progress) -> DFSResult:
    t = cfg.tree
    tr = cfg.train
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    m = cfg.model
    model = SearchTransformer(
        t.k, m.heads, init_scale=m.init_scale, seed=cfg.seed, window=m.window,
        depth_features=m.depth_features, recency_init=m.recency_init, block_init=m.block_init,
    )  # fmt: skip
    model.e.requires_grad_(m.depth_embedding)
    # one group per block, at the block's share of the learning rate (Adam is per element, so
    # equal shares are the single-group optimizer)
    opt = torch.optim.Adam(
        [{"params": [q], "lr": tr.lr * tr.block_lr.get(name, 1.0)}
         for name, q in model.named_parameters() if q.requires_grad],
        lr=tr.lr,
    )  # fmt: skip
    history: list[dict[str, float]] = []
    total = sum(tr.iterations)
    step = 0
    t0 = time.perf_counter()
    kw = {"goal": t.goal, "zipf_s": t.zipf_s, "gamma": t.gamma}
    for i_stage, (stage, n_iter) in enumerate(zip(tr.depths, tr.iterations, strict=True)):
        depths = stage if isinstance(stage, list) else [stage]
        trained_heads = None if tr.stage_heads is None else tr.stage_heads[i_stage]
        for _ in range(n_iter):
            # one batch per depth of the stage, each with its own baseline
            envs = [
                play(model, t.k, d, tr.batch // len(depths), gen, **kw,
                     budget=training_budget(t.k, d, tr.budget_frac))
                for d in depths
            ]  # fmt: skip
            terms, ent_sum, n_moves = [], 0.0, 0
            for env in envs:
                lp, ent, valid = log_probs(model, env)
                adv = env.reward - env.reward.mean()
                terms.append((adv[:, None] * lp).sum())
                ent_sum = ent_sum + ent.sum()
                n_moves = n_moves + valid.sum()
            n_moves = n_moves.clamp(min=1)
            loss = -sum(terms) / n_moves - tr.ent_coef * ent_sum / n_moves
            opt.zero_grad(set_to_none=True)
            loss.backward()
            with _only_heads(model, trained_heads):
                torch.nn.utils.clip_grad_norm_(model.parameters(), tr.max_grad_norm)
                opt.step()
            step += 1
            leaves = torch.tensor([len(v) for e in envs for v in e.leaves], dtype=torch.float)
            row = {
                "train/iteration": step,
                "train/depth": max(depths),
                "rollout/success": float(torch.cat([e.found for e in envs]).float().mean()),
                "rollout/return": float(torch.cat([e.reward for e in envs]).mean()),
                "rollout/leaves": float(leaves.mean()),
                "rollout/revisit_rate": sum(_revisit_rate(e) for e in envs) / len(envs),
                "loss/entropy": float(ent_sum.detach() / n_moves),
                "perf/elapsed_s": time.perf_counter() - t0,
            }
            history.append(row)
            if run is not None:
                run.log(step, row)
            if progress is not None:
                progress(step, total, step, {"rollout/success": row["rollout/success"]})
        if run is not None and tr.stage_heads is not None:  # what each stage left
            attention_picture(model, t.k, 4, run.path / f"attention_stage{i_stage + 1}.png")
    if run is not None:
        torch.save({"state": model.state_dict(), "k": t.k, "heads": m.heads, "window": m.window,
                    "depth_features": m.depth_features}, run.path / "model.pt")  # fmt: skip
    return DFSResult(model, history)


@contextlib.contextmanager
def _only_heads(model: SearchTransformer, heads: list[int] | None):
    """Around a clip-and-step: the per-head blocks of heads not in ``heads`` get no gradient
    and end the step where they began (Adam's momentum would move them otherwise); the shared
    output bias always trains. ``None``: every head trains."""
    if heads is None:
        yield
        return
    frozen = [h for h in range(model.heads) if h not in heads]
    per_head = [q for name, q in model.named_parameters() if name != "bias"]
    for q in per_head:
        if q.grad is not None:
            q.grad[frozen] = 0.0
    before = [q.detach()[frozen].clone() for q in per_head]
    yield
    with torch.no_grad():
        for q, old in zip(per_head, before, strict=True):
            q[frozen] = old


def load_search_model(run_dir: str | Path) -> SearchTransformer:
    """The model a ``kind: dfs`` run saved in ``model.pt``."""
    path = Path(run_dir) / "model.pt"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no model.pt (not a finished kind: dfs run)")
    saved = torch.load(path, weights_only=True)
    model = SearchTransformer(saved["k"], saved["heads"], window=saved.get("window"),
                              depth_features=saved.get("depth_features", "none"))  # fmt: skip
    model.load_state_dict(saved["state"])
    return model


# --------------------------------------------------------------------------- evaluation


def _revisit_rate(env: TreeBatch) -> float:
    """Share of leaf visits that returned to a leaf already visited in that episode."""
    total = again = 0
    for leaves in env.leaves:
        total += len(leaves)
        again += len(leaves) - len(set(leaves))
    return again / max(total, 1)


def _ranked_share(env: TreeBatch, probs: np.ndarray) -> float:
    """Over internal nodes whose children were all first entered in an episode, the share
    entered in order of goal probability (``probs``, ties by index)."""
    order = sorted(range(env.k), key=lambda i: (-probs[i], i))
    good = total = 0
    for leaves in env.leaves:
        first: dict[tuple[int, ...], list[int]] = {}
        for leaf in leaves:
            for j in range(env.depth):
                kids = first.setdefault(leaf[:j], [])
                if leaf[j] not in kids:
                    kids.append(leaf[j])
        for kids in first.values():
            if len(kids) == env.k:
                total += 1
                good += kids == order
    return good / total if total else float("nan")


@torch.no_grad()
def evaluate_search(
    model: SearchTransformer,
    k: int,
    depths: list[int],
    episodes: int = 256,
    seed: int = 0,
    greedy: bool = False,
    **tree_kwargs: Any,
) -> list[dict[str, float]]:
    """Per depth: success within the budget, mean leaves visited (and randomized DFS's),
    the revisit rate, and the share of nodes searched in ranked order."""
    rows = []
    probs = branch_probs(k, tree_kwargs.get("goal", "uniform"), tree_kwargs.get("zipf_s", 1.0))
    for d in depths:
        gen = torch.Generator().manual_seed(seed + d)
        env = play(model, k, d, episodes, gen, greedy=greedy, **tree_kwargs)
        leaves = np.array([len(v) for v in env.leaves], dtype=float)
        found = env.found.numpy()
        rows.append(
            {
                "depth": d,
                "success": float(found.mean()),
                "leaves": float(leaves.mean()),
                "leaves_se": float(leaves.std() / math.sqrt(len(leaves))),
                "leaves_found": float(leaves[found].mean()) if found.any() else float("nan"),
                "random_dfs_leaves": random_dfs_leaves(k, d),
                "revisit_rate": _revisit_rate(env),
                "ranked_share": _ranked_share(env, probs),
                "return": float(env.reward.mean()),
            }
        )
    return rows


def attention_picture(
    model: SearchTransformer, k: int, depth: int, path: Path, seed: int = 0, goal_child: int = -1
) -> None:
    """What each head attends to in one greedy episode: a heatmap per head, decisions down,
    keys across, tokens labelled. The goal is the leaf reached by taking child ``goal_child``
    at every depth (the last leaf by default; pick another for a model that tries it first)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gen = torch.Generator().manual_seed(seed)
    goal = goal_child % k
    env = play(model, k, depth, 1, gen, greedy=True, goals=torch.full((1, depth), goal))
    pos, _ = _decision_positions(env)
    pos = pos[:, pos[0] >= 0]
    L = int(env.length[0])
    with torch.no_grad():
        _, attn = model(env.tokens[:, :L], env.depths[:, :L], env.attempts[:, :L], pos,
                        env.depths.gather(1, pos + 1), env.attempts.gather(1, pos + 1),
                        return_attn=True)  # fmt: skip
    names = {k: "F", k + 1: "B"}
    labels = [names.get(int(x), str(int(x) + 1)) for x in env.tokens[0, :L]]
    moves = [labels[int(p) + 1] + f"@{int(env.depths[0, int(p) + 1])}" for p in pos[0]]
    n = model.heads
    fig, axes = plt.subplots(1, n, figsize=(4.5 * n, 0.18 * len(moves) + 2), squeeze=False)
    for h in range(n):
        ax = axes[0, h]
        ax.imshow(attn[0, h].numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"head {h + 1}")
        ax.set_xticks(range(L), labels, fontsize=5)
        ax.set_yticks(range(len(moves)), moves, fontsize=5)
        ax.set_xlabel("key token (child, F = FAIL, B = BOS)")
    axes[0, 0].set_ylabel("decision (move @ depth)")
    where = "last leaf" if goal == k - 1 else f"child {goal + 1} at every depth"
    fig.suptitle(f"attention of each head, greedy search of a depth-{depth} tree (goal: {where})")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def write_search_eval(
    run_dir: Path, rows: list[dict[str, float]], extra: dict[str, Any], tag: str = ""
) -> str:
    """``search_eval<tag>.json`` and ``.md`` (a table) in ``run_dir``; returns the table."""
    head = "| depth | success | leaves visited | randomized DFS | revisit rate | ranked share |"
    lines = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['depth']} | {r['success']:.3f} | {r['leaves']:.2f} ± {r['leaves_se']:.2f} | "
            f"{r['random_dfs_leaves']:.1f} | {r['revisit_rate']:.3f} | {r['ranked_share']:.3f} |"
        )
    md = "\n".join(lines) + "\n"
    (run_dir / f"search_eval{tag}.json").write_text(
        json.dumps({**extra, "rows": rows}, indent=2) + "\n"
    )
    (run_dir / f"search_eval{tag}.md").write_text(md)
    return md


def ablation_table(root: str | Path, depths: list[int] | None = None, episodes: int | None = None):
    """Score every run of a ``tokenergy ablate`` folder of a ``kind: dfs`` config with
    :func:`evaluate_search` (sampled moves, the same goals for every run), and write
    ``search_ablation.md`` (success and leaves per variant and depth, mean ± std over seeds)
    and ``search_ablation.png`` (success against depth). Returns the markdown."""
    import yaml

    from tokenergy.config import config_from_dict

    root = Path(root)
    meta = yaml.safe_load((root / "ablation.yaml").read_text())
    base = config_from_dict(meta["base"])
    trained = _trained_depths(base)
    depths = list(depths or sorted({*trained, *base.eval.depths}))
    episodes = episodes or base.eval.episodes
    t = base.tree
    table: dict[str, list[list[dict[str, float]]]] = {}
    for variant in meta["variants"]:
        for run in sorted((root / variant).glob("seed_*")):
            rows = evaluate_search(
                load_search_model(run), t.k, depths, episodes, goal=t.goal, zipf_s=t.zipf_s,
                gamma=t.gamma,
            )  # fmt: skip
            write_search_eval(run, rows, {"k": t.k, "goal": t.goal})
            table.setdefault(variant, []).append(rows)
    lines = [
        "| variant | seeds | " + " | ".join(f"depth {d}: success / leaves" for d in depths) + " |",
        "|---|---|" + "---|" * len(depths),
    ]
    for variant, runs in table.items():
        cells = []
        for i in range(len(depths)):
            succ = np.array([r[i]["success"] for r in runs])
            leaves = np.array([r[i]["leaves"] for r in runs])
            cells.append(f"{succ.mean():.2f} ± {succ.std():.2f} / {leaves.mean():.1f}")
        lines.append(f"| {variant} | {len(runs)} | " + " | ".join(cells) + " |")
    lines.append(
        "| randomized DFS | – | "
        + " | ".join(f"1.00 / {random_dfs_leaves(t.k, d):.1f}" for d in depths)
        + " |"
    )
    lines.append(
        "| uniformly random moves | – | "
        + " | ".join(
            f"{random_moves_success(t.k, d):.2f} / {random_moves_leaves(t.k, d):.1f}"
            for d in depths
        )
        + " |"
    )
    md = "\n".join(lines) + "\n"
    (root / "search_ablation.md").write_text(md)
    _ablation_plot(table, depths, root / "search_ablation.png", base)
    return md


def _trained_depths(base) -> list[int]:
    """Every depth the curriculum trains, a mixed stage ([1, 2]) counted as its depths."""
    return [x for d in base.train.depths for x in (d if isinstance(d, list) else [d])]


def _ablation_plot(table, depths, path: Path, base) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (variant, runs) in enumerate(table.items()):
        succ = np.array([[r[j]["success"] for j in range(len(depths))] for r in runs])
        m, sd = succ.mean(0), succ.std(0)
        ax.plot(depths, m, marker="o", color=f"C{i}", label=f"{variant} ({len(runs)} seeds)")
        ax.fill_between(depths, m - sd, m + sd, color=f"C{i}", alpha=0.2)
    ax.plot(depths, [random_moves_success(base.tree.k, d) for d in depths], color="grey",
            linestyle="--", label="uniformly random moves")  # fmt: skip
    trained = _trained_depths(base)
    ax.axvspan(min(trained) - 0.5, max(trained) + 0.5, color="grey", alpha=0.15, label="trained")
    ax.set_xlabel("tree depth")
    ax.set_ylabel("success within k^depth leaf visits")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"learning to search, k = {base.tree.k}: trained on depths {trained}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)

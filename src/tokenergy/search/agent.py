"""The LM agent as a :class:`~tokenergy.search.planners.SearchModel` (:class:`LMSearchModel`)
and :func:`compare`: plain sampling against the searches on the same held-out seeds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tokenergy.envs.text import TextEnv
from tokenergy.search.planners import (
    Proposal,
    SearchState,
    agent_tokens,
    beam,
    best_of_n,
    mcts,
    play,
)


class LMSearchModel:
    """:class:`SearchModel` over an :class:`~tokenergy.models.AgentModel` (greedy reasoning,
    legal moves scored after it, the value head as the leaf value)."""

    def __init__(self, agent, max_turn_tokens: int = 48, instructions: bool = False) -> None:
        from tokenergy.rollout import tag_ids_of

        self.agent = agent
        self.tok = agent.tokenizer
        self.max_turn_tokens = max_turn_tokens
        self.instructions = instructions
        self.tags = tag_ids_of(self.tok)

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False).input_ids

    def root(self, env: TextEnv, seed: int) -> SearchState:
        from tokenergy.rollout import prompt_ids

        env = env.clone()
        obs, _ = env.reset(seed=seed)
        return SearchState(env, prompt_ids(self.tok, env, obs, self.instructions))

    @torch.no_grad()
    def propose(self, state: SearchState) -> Proposal:
        from tokenergy.rollout import generate_turns

        agent, device = self.agent, self.agent.device
        stops = {self.tags["<answer>"], self.tags["</answer>"], self.tags["eos"]}
        reasoning = generate_turns(
            agent.policy, [state.context], stops, self.tok.pad_token_id,
            self.max_turn_tokens, 0.0, 1.0, None,
        )[0]  # fmt: skip
        generated = len(reasoning)
        if not reasoning or reasoning[-1] != self.tags["<answer>"]:
            reasoning = [t for t in reasoning if t not in stops] + [self.tags["<answer>"]]
        actions = state.env.legal_actions()
        prefix = state.context + reasoning
        cands = [[*self._ids(a), self.tags["</answer>"]] for a in actions]
        length = len(prefix) + max(len(c) for c in cands)
        ids = torch.full((len(cands), length), self.tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, c in enumerate(cands):
            row = prefix + c
            ids[i, : len(row)] = torch.tensor(row)
            attn[i, : len(row)] = 1
        out = agent(ids.to(device), attn.to(device))
        logp = torch.log_softmax(out.logits.float(), -1)
        scores = []
        for i, c in enumerate(cands):
            move = c[:-1]  # the move's own tokens: a move is not penalised for being chainable
            pos = torch.arange(len(prefix) - 1, len(prefix) - 1 + len(move))
            scores.append(float(logp[i, pos, torch.tensor(move)].sum()))
        # the value of the state: the value head after the observation, before the reasoning
        value = float(out.values[0, len(state.context) - 1])
        return Proposal(reasoning, actions, scores, value, generated)

    @torch.no_grad()
    def value(self, state: SearchState) -> float:
        """The value head after the state's last token."""
        ids = torch.tensor([state.context], device=self.agent.device)
        return float(self.agent(ids).values[0, -1])

    def step(
        self, state: SearchState, action: str, proposal: Proposal
    ) -> tuple[SearchState, float]:
        from tokenergy.rollout import encode_observation

        turn = proposal.reasoning + self._ids(action) + [self.tags["</answer>"]]
        env = state.env.clone()
        obs, reward, term, trunc, info = env.step(self.tok.decode(turn, skip_special_tokens=False))
        done = term or trunc
        child = SearchState(
            env,
            state.context + turn + encode_observation(self.tok, obs),
            done=done,
            success=bool(info.get("success", False)),
            ret=state.ret + reward,
        )
        return child, reward


# --------------------------------------------------------------------------- evaluation


def compare(
    agent,
    cfg,
    algo: str,
    episodes: int,
    simulations: int = 64,
    width: int = 4,
    c_value: float = 1.0,
    n: int = 8,
    c_puct: float = 1.5,
    progress: Any = None,
) -> list[dict[str, float]]:
    """Greedy decoding, sampling, and ``algo`` (``mcts``, ``beam`` or ``best_of_n``) on the same
    held-out env seeds of a run's config: success rate, mean return, tokens generated and
    seconds per episode.
    """
    import time

    from tokenergy.envs import make
    from tokenergy.rollout import rollout

    if algo not in ("mcts", "beam", "best_of_n"):
        raise ValueError(f"search: algo must be mcts, beam or best_of_n, got {algo!r}")
    seeds = [cfg.eval.seed_offset + i for i in range(episodes)]
    env = make(cfg.env.name, **cfg.env.kwargs)
    model = LMSearchModel(agent, cfg.rollout.max_turn_tokens, cfg.rollout.instructions)
    gen = torch.Generator().manual_seed(cfg.seed)
    rows = []

    def add(name: str, wins: list[bool], rets: list[float], tokens: int, seconds: float):
        rows.append({
            "method": name, "success": float(np.mean(wins)), "return": float(np.mean(rets)),
            "tokens_per_episode": tokens / episodes, "seconds_per_episode": seconds / episodes,
        })  # fmt: skip

    for name, temp in (("greedy", 0.0), ("sampled", cfg.rollout.temperature or 1.0)):
        t0 = time.perf_counter()
        eps = rollout(
            agent.policy, agent.tokenizer, [env.clone() for _ in seeds], seeds,
            max_turns=cfg.env.max_turns, max_turn_tokens=cfg.rollout.max_turn_tokens,
            instructions=cfg.rollout.instructions, temperature=temp, generator=gen,
        )  # fmt: skip
        tokens = agent_tokens(eps)
        add(name, [e.success for e in eps], [e.episode_return for e in eps], tokens,
            time.perf_counter() - t0)  # fmt: skip

    wins, rets, tokens = [], [], 0
    t0 = time.perf_counter()
    for i, seed in enumerate(seeds):
        if algo == "best_of_n":
            best, _, used = best_of_n(
                agent, env, seed, n, cfg.env.max_turns, cfg.rollout.max_turn_tokens,
                cfg.rollout.temperature or 1.0, generator=gen,
            )  # fmt: skip
            wins.append(best.success)
            rets.append(best.episode_return)
        elif algo == "beam":
            state, _, used = beam(model, model.root(env, seed), width, cfg.env.max_turns, c_value)
            wins.append(state.success)
            rets.append(state.ret)
        else:

            def choose(state):
                res = mcts(model, state, simulations, c_puct)
                return res.action, res.root.proposal, res.generated

            state, used = play(model, env, seed, choose, cfg.env.max_turns)
            wins.append(state.success)
            rets.append(state.ret)
        tokens += used
        if progress is not None:
            progress(i + 1, episodes)
    label = {"mcts": f"mcts ({simulations} sims)", "beam": f"beam (width {width}, c {c_value:g})",
             "best_of_n": f"best-of-{n}"}[algo]  # fmt: skip
    add(label, wins, rets, tokens, time.perf_counter() - t0)
    return rows

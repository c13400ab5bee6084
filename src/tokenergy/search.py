"""Inference-time search for LM agents in text environments: MCTS, value-guided beam search,
best-of-n.

The search runs over the environment's legal moves (``env.legal_actions()``) on copies of the
environment (``env.clone()``). A :class:`SearchModel` is what the search asks of the agent:

- ``root(env, seed)``: the start state (the env reset, the prompt tokens);
- ``propose(state)``: the agent's own greedy reasoning for the turn, then the log-probability
  of each legal move's tokens written after it (after ``<answer>``), and the value of the
  state (the value head);
- ``step(state, action, proposal)``: the turn played on a copy of the env.

:class:`LMSearchModel` implements it for an :class:`~tokenergy.models.AgentModel`; the search
functions only see the protocol, so tests drive them with hand-made models. Everything here
is inference: no gradient, no change to the agent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from tokenergy.envs.text import TextEnv
from tokenergy.types import Role

__all__ = [
    "LMSearchModel",
    "MCTSResult",
    "Node",
    "Proposal",
    "SearchModel",
    "SearchState",
    "beam",
    "best_of_n",
    "compare",
    "mcts",
    "play",
]


@dataclass
class SearchState:
    """One state of the search: the env (owned by this state), the tokens so far, the return."""

    env: TextEnv
    context: list[int]
    done: bool = False
    success: bool = False
    ret: float = 0.0


@dataclass
class Proposal:
    """What the agent proposes in a state: its reasoning, a log-prob per legal move, a value."""

    reasoning: list[int]
    actions: list[str]
    logprobs: list[float]
    value: float
    generated: int = 0  # tokens the agent generated to make this proposal

    def priors(self) -> list[float]:
        m = max(self.logprobs)
        e = [math.exp(x - m) for x in self.logprobs]
        return [x / sum(e) for x in e]


class SearchModel(Protocol):
    def root(self, env: TextEnv, seed: int) -> SearchState: ...

    def propose(self, state: SearchState) -> Proposal: ...

    def step(
        self, state: SearchState, action: str, proposal: Proposal
    ) -> tuple[SearchState, float]: ...


# --------------------------------------------------------------------------- MCTS


@dataclass
class Node:
    """A node of the MCTS tree. ``reward`` is what entering it paid; ``w`` sums the returns
    (entry reward plus discounted value below) of the ``n`` simulations through it."""

    prior: float = 1.0
    action: str | None = None
    state: SearchState | None = None
    reward: float = 0.0
    proposal: Proposal | None = None
    children: list[Node] = field(default_factory=list)
    n: int = 0
    w: float = 0.0

    @property
    def q(self) -> float:
        return self.w / self.n if self.n else 0.0

    @property
    def expanded(self) -> bool:
        return self.proposal is not None

    def visits(self) -> dict[str, int]:
        return {c.action: c.n for c in self.children}


@dataclass
class MCTSResult:
    action: str
    visits: dict[str, int]
    root: Node
    generated: int  # tokens generated over all simulations


def mcts(
    model: SearchModel,
    state: SearchState,
    simulations: int = 64,
    c_puct: float = 1.5,
    gamma: float = 1.0,
    dirichlet_alpha: float | None = None,
    noise_frac: float = 0.25,
    rng: np.random.Generator | None = None,
) -> MCTSResult:
    """PUCT search (Silver et al., 2017) over the legal moves from ``state``.

    Each simulation walks down by ``argmax Q + c_puct · P · sqrt(N_parent) / (1 + N_child)``
    (``Q = 0`` for an unvisited child, ties to the earlier legal move), plays the move on a
    copy of the env when a child is first reached, asks the model for priors and a value at
    the new leaf (a finished episode is worth 0 beyond its reward), and backs up
    ``reward + gamma · value``. The first simulation only expands the root.

    Args:
        model: a :class:`SearchModel`.
        state: the state to choose a move in (not modified).
        simulations: number of simulations, ``>= 1``.
        c_puct: exploration constant.
        gamma: discount per move.
        dirichlet_alpha: root prior noise ``(1 - f) · P + f · Dir(alpha)`` (``f = noise_frac``);
            ``None`` turns it off.
        rng: the noise's generator.

    Returns:
        The most visited move (ties: the higher prior, then the earlier), the root's visit
        counts, the tree, and the tokens generated.
    """
    if simulations < 1:
        raise ValueError(f"mcts: simulations must be >= 1, got {simulations}")
    if state.done:
        raise ValueError("mcts: the state is terminal; there is no move to choose")
    root = Node(state=state)
    generated = 0
    for _ in range(simulations):
        node, path = root, [root]
        while node.expanded and node.children and not node.state.done:
            parent = node
            sqrt_n = math.sqrt(max(parent.n, 1))
            node = max(
                parent.children,
                key=lambda c: c.q + c_puct * c.prior * sqrt_n / (1 + c.n),
            )
            if node.state is None:
                node.state, node.reward = model.step(parent.state, node.action, parent.proposal)
            path.append(node)
        value = 0.0
        if not node.state.done and not node.expanded:
            prop = model.propose(node.state)
            generated += prop.generated
            node.proposal = prop
            priors = prop.priors()
            if node is root and dirichlet_alpha is not None:
                noise = (rng or np.random.default_rng()).dirichlet([dirichlet_alpha] * len(priors))
                priors = [
                    (1 - noise_frac) * p + noise_frac * x
                    for p, x in zip(priors, noise, strict=True)
                ]
            node.children = [
                Node(prior=p, action=a) for a, p in zip(prop.actions, priors, strict=True)
            ]
            value = prop.value
        for n in reversed(path[1:]):
            value = n.reward + gamma * value
            n.n += 1
            n.w += value
        root.n += 1
    best = max(root.children, key=lambda c: (c.n, c.prior, -root.children.index(c)))
    return MCTSResult(best.action, root.visits(), root, generated)


# --------------------------------------------------------------------------- beam, best-of-n


@dataclass
class _Beam:
    state: SearchState
    score: float
    turns: list[str]


def beam(
    model: SearchModel,
    state: SearchState,
    width: int = 4,
    depth: int = 10,
    c_value: float = 1.0,
    c_energy: float = 0.0,
    energy: Any = None,
) -> tuple[SearchState, list[str], int]:
    """Value-guided beam search over turns.

    Each beam state's legal moves become candidates scored by the beam's score plus the move's
    log-probability plus ``c_value`` times the value of the state it leads to (the value
    head; a finished episode's return instead), minus ``c_energy · energy(state, action)``
    when an energy function is given; the ``width`` best survive, for up to ``depth`` turns
    or until every beam has finished. Width 1 with ``c_value = 0`` (and no energy) plays the
    agent's most likely legal move after its greedy reasoning each turn: greedy decoding
    whenever greedy decoding writes a legal move.

    Returns:
        ``(the best final state, its turn texts, tokens generated)``.
    """
    if width < 1 or depth < 1:
        raise ValueError(f"beam: width and depth must be >= 1, got {width}, {depth}")
    beams = [_Beam(state, 0.0, [])]
    generated = 0
    for _ in range(depth):
        if all(b.state.done for b in beams):
            break
        cands: list[_Beam] = []
        for b in beams:
            if b.state.done:
                cands.append(b)
                continue
            prop = model.propose(b.state)
            generated += prop.generated
            for action, lp in zip(prop.actions, prop.logprobs, strict=True):
                child, _ = model.step(b.state, action, prop)
                score = b.score + lp
                if c_value:
                    v = child.ret if child.done else child.ret + _value(model, child)
                    score += c_value * v
                if c_energy and energy is not None:
                    score -= c_energy * float(energy(b.state, action))
                cands.append(_Beam(child, score, [*b.turns, action]))
        cands.sort(key=lambda c: -c.score)  # stable: ties keep the legal-move order
        beams = cands[:width]
    best = max(beams, key=lambda b: (b.state.done and b.state.success, b.state.ret, b.score))
    return best.state, best.turns, generated


def _value(model: SearchModel, state: SearchState) -> float:
    value = getattr(model, "value", None)  # a cheaper value-only call, when the model has one
    return float(value(state)) if value is not None else model.propose(state).value


def play(
    model: SearchModel, env: TextEnv, seed: int, choose, max_turns: int
) -> tuple[SearchState, int]:
    """Play one episode where ``choose(state) -> (action, proposal, tokens)`` picks each move.

    Returns:
        ``(final state, tokens generated)``.
    """
    state = model.root(env, seed)
    generated = 0
    for _ in range(max_turns):
        if state.done:
            break
        action, prop, tokens = choose(state)
        generated += tokens
        state, _ = model.step(state, action, prop)
    return state, generated


def _agent_tokens(episodes) -> int:
    """Tokens the agent wrote (every role but OBSERVATION) over a list of episodes."""
    return sum(sum(1 for r in e.roles if r != int(Role.OBSERVATION)) for e in episodes)


def best_of_n(
    agent,
    env: TextEnv,
    seed: int,
    n: int,
    max_turns: int,
    max_turn_tokens: int = 48,
    temperature: float = 1.0,
    verifier: Any = None,
    generator: torch.Generator | None = None,
) -> tuple[Any, list[float], int]:
    """``n`` sampled episodes from the same env seed; the best by return (or ``verifier(episode)``).

    Returns:
        ``(best episode, every episode's score, tokens generated)``.
    """
    from tokenergy.rollout import rollout

    if n < 1:
        raise ValueError(f"best_of_n: n must be >= 1, got {n}")
    eps = rollout(
        agent.policy,
        agent.tokenizer,
        [env.clone() for _ in range(n)],
        [seed] * n,
        max_turns=max_turns,
        max_turn_tokens=max_turn_tokens,
        temperature=temperature,
        generator=generator,
    )
    scores = [float(verifier(e)) if verifier is not None else e.episode_return for e in eps]
    generated = _agent_tokens(eps)
    return eps[int(np.argmax(scores))], scores, generated


# --------------------------------------------------------------------------- the LM model


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
        tokens = _agent_tokens(eps)
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

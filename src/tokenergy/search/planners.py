"""The search algorithms over a :class:`SearchModel`: MCTS, value-guided beam search,
best-of-n, and :func:`play` (a greedy episode from a search's choices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from tokenergy.envs.text import TextEnv
from tokenergy.types import Role


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


def agent_tokens(episodes) -> int:
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
    generated = agent_tokens(eps)
    return eps[int(np.argmax(scores))], scores, generated

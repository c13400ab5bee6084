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

from tokenergy.search.agent import LMSearchModel, compare
from tokenergy.search.planners import (
    MCTSResult,
    Node,
    Proposal,
    SearchModel,
    SearchState,
    beam,
    best_of_n,
    mcts,
    play,
)

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

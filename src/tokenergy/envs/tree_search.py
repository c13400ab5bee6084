"""Find a hidden goal leaf in a full k-ary tree: the search task of Yang, Huang, Liang, Chi,
*Agentic Transformers Provably Learn to Search via RL* (arXiv:2606.00183).

Each move picks a child (``1`` … ``k``). Reaching a leaf that is not the goal prints ``FAIL``
and puts the agent back at the root, its history still in the context; reaching the goal ends
the episode with reward ``gamma ** t`` (``t`` the 0-based index of the move that reached it;
1 when ``gamma == 1``). The budget is ``budget`` leaf visits (``k ** depth`` by default, enough
for a depth-first search that never visits a leaf twice); the episode is truncated when it
is spent. The goal is drawn per episode: ``uniform`` over leaves, or ``zipf`` — at every
internal node the goal lies under child ``i`` (0-based) with probability
``∝ (i + 1) ** -zipf_s``, so low-numbered branches are likelier ("ranked" search pays).
"""

from __future__ import annotations

import numpy as np

from tokenergy.envs.text import TEXT_ENVS, TextEnv

__all__ = ["TreeSearchText", "branch_probs"]


def branch_probs(k: int, goal: str, zipf_s: float) -> np.ndarray:
    """Probability that the goal lies under each child of an internal node."""
    if goal == "uniform":
        return np.full(k, 1.0 / k)
    p = (np.arange(k) + 1.0) ** -zipf_s
    return p / p.sum()


class TreeSearchText(TextEnv):
    """A hidden goal leaf in a full ``k``-ary tree of ``depth`` levels.

    Args:
        k: children per internal node, 2 … 9.
        depth: levels below the root, ``>= 1``.
        goal: ``uniform`` or ``zipf`` (see the module docstring).
        zipf_s: the Zipf exponent of ``goal="zipf"``.
        gamma: discount of the goal reward per move.
        budget: leaf visits allowed; ``None`` means ``k ** depth``.
        max_actions_per_turn: moves one turn may chain (``1 || 2``); ``None`` means ``depth``.
        invalid_penalty: reward of an invalid turn (it also uses up one move of the budget).

    ``options={"goal": (i_1, …, i_depth)}`` in ``reset`` fixes the goal (0-based children).
    """

    name = "tree_search"
    instructions = "find the goal leaf of the tree . each move picks a child by its number"

    def __init__(
        self,
        k: int = 2,
        depth: int = 2,
        goal: str = "uniform",
        zipf_s: float = 1.0,
        gamma: float = 1.0,
        budget: int | None = None,
        max_actions_per_turn: int | None = None,
        invalid_penalty: float = 0.0,
    ) -> None:
        if not 2 <= k <= 9:
            raise ValueError(f"tree_search: k must be in [2, 9], got {k}")
        if depth < 1:
            raise ValueError(f"tree_search: depth must be >= 1, got {depth}")
        if goal not in ("uniform", "zipf"):
            raise ValueError(f"tree_search: goal must be uniform or zipf, got {goal!r}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"tree_search: gamma must be in (0, 1], got {gamma}")
        budget = k**depth if budget is None else budget
        if budget < 1:
            raise ValueError(f"tree_search: budget must be >= 1, got {budget}")
        # Every move goes one level down, so `budget` leaf visits take exactly budget * depth moves.
        super().__init__(budget * depth, max_actions_per_turn or depth, invalid_penalty)
        self.k, self.depth, self.goal_kind, self.zipf_s = k, depth, goal, zipf_s
        self.gamma, self.budget = gamma, budget
        self.probs = branch_probs(k, goal, zipf_s)
        self.goal: tuple[int, ...] = (0,) * depth
        self.path: list[int] = []
        self.visited: list[tuple[int, ...]] = []  # leaves reached, in order (the goal last)
        self.found = False
        self.failed = False  # the last move reached a non-goal leaf

    def _reset(self, options: dict) -> None:
        goal = options.get("goal")
        if goal is None:
            goal = tuple(int(self.rng.choice(self.k, p=self.probs)) for _ in range(self.depth))
        goal = tuple(int(g) for g in goal)
        if len(goal) != self.depth or not all(0 <= g < self.k for g in goal):
            raise ValueError(f"tree_search: goal must be {self.depth} children in [0, {self.k})")
        self.goal, self.path, self.visited = goal, [], []
        self.found = self.failed = False

    def _parse(self, move: str) -> int | None:
        move = move.strip()
        if len(move) != 1 or not move.isascii() or not move.isdigit():
            return None
        child = int(move) - 1
        return child if 0 <= child < self.k else None

    def _apply(self, move: int) -> tuple[float, bool]:
        t = self.steps  # moves made before this one
        self.path.append(move)
        self.failed = False
        if len(self.path) < self.depth:
            return 0.0, False
        leaf, self.path = tuple(self.path), []
        self.visited.append(leaf)
        if leaf == self.goal:
            self.found = True
            return float(self.gamma**t), True
        self.failed = True
        return 0.0, False

    def solved(self) -> bool:
        return self.found

    def render(self) -> str:
        if self.found:
            return "goal found"
        where = "root" if not self.path else "node " + " ".join(str(c + 1) for c in self.path)
        head = "FAIL . back at" if self.failed else "at"
        return f"{head} {where} . depth {len(self.path)} of {self.depth}"

    # ---- the solver: ranked depth-first search ----------------------------------------------

    def _order(self) -> list[int]:
        """Children in order of goal probability (index order on ties)."""
        return sorted(range(self.k), key=lambda i: (-self.probs[i], i))

    def _untried(self, prefix: tuple[int, ...]) -> bool:
        """Whether the subtree under ``prefix`` holds a leaf not visited yet."""
        below = self.k ** (self.depth - len(prefix))
        seen = {leaf for leaf in self.visited if leaf[: len(prefix)] == prefix}
        return len(seen) < below

    def solver_action(self) -> str:
        prefix = tuple(self.path)
        for child in self._order():
            if self._untried((*prefix, child)):
                return str(child + 1)
        return str(self._order()[0] + 1)  # every leaf tried (cannot happen within the budget)

    def legal_actions(self) -> list[str]:
        return [str(i + 1) for i in range(self.k)]

    def random_action(self, rng: np.random.Generator) -> str:
        return str(int(rng.integers(self.k)) + 1)

    def reasoning(self) -> str:
        return f"tried {len(self.visited)} leaves . next untried branch {self.solver_action()}"

    @classmethod
    def vocabulary(cls) -> list[str]:
        return ["goal", "found", "FAIL", "back", "at", "root", "node", "depth", "of", "tried",
                "leaves", "next", "untried", "branch"]  # fmt: skip


@TEXT_ENVS.register("tree_search")
def _make_tree_search(**kwargs) -> TreeSearchText:
    return TreeSearchText(**kwargs)

"""FrozenLake as a text game, with Gymnasium's ``FrozenLake-v1`` transition rule and rewards.

The map uses Gymnasium's letters (``S`` start, ``F`` frozen, ``H`` hole, ``G`` goal); moves
are ``Left``, ``Down``, ``Right``, ``Up`` (case-insensitive). Slippery: the intended move or
either perpendicular one, 1/3 each, exactly as Gymnasium draws it. Reward 1 on reaching the
goal, 0 otherwise; a hole or the goal ends the episode.

Two observations: ``grid`` (the map in Gymnasium's letters, ``P`` for the player) and
``coords``, the ActFocus paper's CoordFrozenLake wording: the board size and the zero-indexed
coordinates of the start, the goal, the player and every hole, then the grid in the paper's
symbols (``P`` player, ``_`` frozen, ``O`` hole, ``G`` goal, ``X`` player in a hole, ``√``
player on the goal; the start is frozen ice).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tokenergy.envs.text import TEXT_ENVS, TextEnv

__all__ = ["LAYOUTS", "MOVES", "FrozenLakeText", "random_map"]

MOVES = ("Left", "Down", "Right", "Up")  # Gymnasium's action ids 0..3
_DELTA = ((0, -1), (1, 0), (0, 1), (-1, 0))
_MOVE_ID = {m.lower(): i for i, m in enumerate(MOVES)}


def _reachable(desc: list[str]) -> bool:
    n, m = len(desc), len(desc[0])
    start = next((r, c) for r in range(n) for c in range(m) if desc[r][c] == "S")
    seen, todo = {start}, deque([start])
    while todo:
        r, c = todo.popleft()
        if desc[r][c] == "G":
            return True
        for dr, dc in _DELTA:
            nr, nc = r + dr, c + dc
            if 0 <= nr < n and 0 <= nc < m and (nr, nc) not in seen and desc[nr][nc] != "H":
                seen.add((nr, nc))
                todo.append((nr, nc))
    return False


LAYOUTS = ("corners", "random")


def random_map(
    size: int, rng: np.random.Generator, p_frozen: float = 0.8, layout: str = "corners"
) -> list[str]:
    """A random ``size x size`` map with a path from ``S`` to ``G``.

    ``layout="corners"`` puts ``S`` top-left and ``G`` bottom-right (Gymnasium's random maps);
    ``"random"`` puts them on two distinct cells drawn uniformly (the ActFocus paper's maps,
    which is why its observation lists both).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"frozenlake: layout must be one of {LAYOUTS}, got {layout!r}")
    while True:
        cells = np.where(rng.random((size, size)) < p_frozen, "F", "H")
        if layout == "corners":
            start, goal = 0, size * size - 1
        else:
            start, goal = (int(k) for k in rng.choice(size * size, 2, replace=False))
        cells[divmod(start, size)], cells[divmod(goal, size)] = "S", "G"
        desc = ["".join(row) for row in cells]
        if _reachable(desc):
            return desc


class FrozenLakeText(TextEnv):
    """Cross the frozen lake from ``S`` to ``G`` without falling into a hole.

    Args:
        desc: the map as a list of strings (Gymnasium's format); ``None`` draws a random
            solvable map of ``map_size`` at every reset.
        map_size: side of random maps.
        is_slippery: Gymnasium's slippery dynamics.
        max_steps: moves before truncation (Gymnasium's 4x4 limit is 100).
        max_actions_per_turn: moves one turn may chain (``Down || Right``).
        invalid_penalty: reward of an invalid turn.
        observation: ``grid`` or ``coords`` (see the module docstring).
        plan_in_reasoning: the solver's scratchpad ends with its plan (``plan : Down
            Right``); without it the scratchpad states what is seen (position, goal and the
            holes next to the player) and the move is decided in the answer.
        strict_format: a turn not exactly ``<think>…</think> <answer>…</answer>`` is invalid.
        extra_actions: ``invalid`` or ``drop`` (see :class:`~tokenergy.envs.text.TextEnv`).
        layout: where random maps put ``S`` and ``G``: ``corners`` (top-left, bottom-right)
            or ``random`` (two distinct random cells, the paper's); see :func:`random_map`.
    """

    name = "frozenlake"
    instructions = "reach G without falling into H . moves : Left Down Right Up"
    plan_marker = "plan :"
    OBSERVATIONS = ("grid", "coords")

    def __init__(
        self,
        desc: list[str] | None = None,
        map_size: int = 4,
        is_slippery: bool = False,
        max_steps: int = 20,
        max_actions_per_turn: int = 1,
        invalid_penalty: float = -0.1,
        observation: str = "grid",
        plan_in_reasoning: bool = True,
        strict_format: bool = False,
        extra_actions: str = "invalid",
        layout: str = "corners",
    ) -> None:
        super().__init__(
            max_steps, max_actions_per_turn, invalid_penalty, strict_format, extra_actions
        )
        self.observation_format = self.checked_observation(observation)
        self.plan_in_reasoning = plan_in_reasoning
        if desc is not None:
            rows = [str(r) for r in desc]
            if not rows or any(len(r) != len(rows[0]) for r in rows):
                raise ValueError("frozenlake: desc must be equal-length strings")
            if set("".join(rows)) - set("SFHG") or "".join(rows).count("S") != 1:
                raise ValueError("frozenlake: desc uses S, F, H, G with exactly one S")
            desc = rows
        if map_size < 2:
            raise ValueError(f"frozenlake: map_size must be >= 2, got {map_size}")
        if layout not in LAYOUTS:
            raise ValueError(f"frozenlake: layout must be one of {LAYOUTS}, got {layout!r}")
        self.layout = layout
        self.fixed_desc = desc
        self.map_size = map_size
        self.is_slippery = is_slippery
        self.desc: list[str] = desc or []
        self.pos = (0, 0)
        self._policy: dict[tuple[int, int], int] | None = None

    def _reset(self, options: dict) -> None:
        self.desc = self.fixed_desc or random_map(self.map_size, self.rng, layout=self.layout)
        self.pos = next(
            (r, c) for r, row in enumerate(self.desc) for c, ch in enumerate(row) if ch == "S"
        )
        self._policy = None

    def _parse(self, move: str) -> int | None:
        return _MOVE_ID.get(move.strip().lower())

    def _move(self, pos: tuple[int, int], action: int) -> tuple[int, int]:
        dr, dc = _DELTA[action]
        r = min(max(pos[0] + dr, 0), len(self.desc) - 1)
        c = min(max(pos[1] + dc, 0), len(self.desc[0]) - 1)
        return r, c

    def _apply(self, move: int) -> tuple[float, bool]:
        if self.is_slippery:  # Gymnasium: uniform over (a - 1) % 4, a, (a + 1) % 4
            move = (move - 1 + int(self.rng.integers(3))) % 4
        self.pos = self._move(self.pos, move)
        cell = self.desc[self.pos[0]][self.pos[1]]
        return (1.0 if cell == "G" else 0.0), cell in "GH"

    def solved(self) -> bool:
        return self.desc[self.pos[0]][self.pos[1]] == "G"

    def _find(self, letter: str) -> list[tuple[int, int]]:
        return [
            (r, c) for r, row in enumerate(self.desc) for c, ch in enumerate(row) if ch == letter
        ]

    def render(self) -> str:
        if self.observation_format == "coords":
            return self._render_coords()
        rows = []
        for r, row in enumerate(self.desc):
            cells = ["P" if (r, c) == self.pos else ch for c, ch in enumerate(row)]
            rows.append(" ".join(cells))
        return "\n".join(rows)

    def _render_coords(self) -> str:
        (sr, sc), (gr, gc) = self._find("S")[0], self._find("G")[0]
        holes = " , ".join(f"{r} {c}" for r, c in self._find("H")) or "none"
        head = (
            f"board {len(self.desc)} x {len(self.desc[0])} . start {sr} {sc} . goal {gr} {gc} . "
            f"player {self.pos[0]} {self.pos[1]} . holes {holes} ."
        )
        paper = {"S": "_", "F": "_", "H": "O", "G": "G"}
        on = {"H": "X", "G": "√"}
        rows = []
        for r, row in enumerate(self.desc):
            cells = [
                on.get(ch, "P") if (r, c) == self.pos else paper[ch] for c, ch in enumerate(row)
            ]
            rows.append(" ".join(cells))
        return head + "\n" + "\n".join(rows)

    # ---- solver: value iteration (shortest path when not slippery) -------------------------

    def _solve(self) -> dict[tuple[int, int], int]:
        n, m = len(self.desc), len(self.desc[0])
        cells = [(r, c) for r in range(n) for c in range(m)]
        value = dict.fromkeys(cells, 0.0)
        outcomes = (
            (lambda a: [((a - 1) % 4, 1 / 3), (a, 1 / 3), ((a + 1) % 4, 1 / 3)])
            if self.is_slippery
            else (lambda a: [(a, 1.0)])
        )
        gamma = 0.99  # < 1 so shorter (and safer-sooner) paths win ties

        def q(s: tuple[int, int], a: int) -> float:
            total = 0.0
            for b, p in outcomes(a):
                t = self._move(s, b)
                ch = self.desc[t[0]][t[1]]
                total += p * (1.0 if ch == "G" else 0.0 if ch == "H" else gamma * value[t])
            return total

        for _ in range(500):
            delta = 0.0
            for s in cells:
                if self.desc[s[0]][s[1]] in "GH":
                    continue
                v = max(q(s, a) for a in range(4))
                delta = max(delta, abs(v - value[s]))
                value[s] = v
            if delta < 1e-9:
                break
        return {s: max(range(4), key=lambda a, s=s: (q(s, a), -a)) for s in cells}

    def solver_action(self) -> str:
        if self._policy is None:
            self._policy = self._solve()
        return MOVES[self._policy[self.pos]]

    def _plan(self, limit: int = 4) -> list[str]:
        """The intended moves from here if nothing slips (what the scratchpad writes)."""
        if self._policy is None:
            self._policy = self._solve()
        pos, plan = self.pos, []
        for _ in range(limit):
            if self.desc[pos[0]][pos[1]] in "GH":
                break
            a = self._policy[pos]
            plan.append(MOVES[a])
            pos = self._move(pos, a)
        return plan

    def solver_moves(self) -> list[str]:
        """Up to ``max_actions_per_turn`` moves of the solver's plan as if nothing slips (the
        second is chosen before the first's slip is seen)."""
        room = self.max_steps - self.steps
        return self._plan(min(self.max_actions_per_turn, room)) or [self.solver_action()]

    def legal_actions(self) -> list[str]:
        return list(MOVES)

    def random_action(self, rng: np.random.Generator) -> str:
        return MOVES[int(rng.integers(4))]

    def holes_near(self) -> list[str]:
        """The moves whose neighbouring cell is a hole, in ``MOVES`` order."""
        near = []
        for a, (dr, dc) in enumerate(_DELTA):
            r, c = self.pos[0] + dr, self.pos[1] + dc
            if 0 <= r < len(self.desc) and 0 <= c < len(self.desc[0]) and self.desc[r][c] == "H":
                near.append(MOVES[a])
        return near

    def state_text(self) -> str:
        """``i am at row 1 col 2 . goal at row 3 col 3``, and without the plan in the
        scratchpad ``… . holes near : Left Up`` (or ``none``), all zero-indexed."""
        gr, gc = self._find("G")[0]
        text = f"i am at row {self.pos[0]} col {self.pos[1]} . goal at row {gr} col {gc}"
        if not self.plan_in_reasoning:
            text += f" . holes near : {' '.join(self.holes_near()) or 'none'}"
        return text

    def reasoning(self) -> str:
        if not self.plan_in_reasoning:
            return self.state_text()
        return f"{self.state_text()} . plan : {' '.join(self._plan())}"

    @classmethod
    def vocabulary(cls) -> list[str]:
        words = [*MOVES, "S", "F", "H", "G", "P", "i", "am", "at", "row", "col", "goal", "plan"]
        words += ["holes", "near", "none", "board", "x", "start", "player", ",", "_", "O", "X"]
        return [*words, "√"]


@TEXT_ENVS.register("frozenlake")
def _make_frozenlake(**kwargs) -> FrozenLakeText:
    return FrozenLakeText(**kwargs)

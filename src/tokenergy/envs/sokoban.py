"""Sokoban as a text game: procedurally generated rooms, solvable by construction.

Symbols (also the format of a fixed level): ``#`` wall, ``_`` floor, ``O`` target, ``X`` box,
``√`` box on target, ``P`` player, ``S`` player on target. Moves: ``Left``, ``Down``,
``Right``, ``Up``. Rewards: −0.1 per move, +1 when a box lands on a target, −1 when it leaves
one, +10 when every box is placed (terminated). Walking into a wall or pushing a box into a
wall or another box is a legal move that changes nothing (it still costs −0.1), as in
gym-sokoban.

Generation runs the game backwards (Taylor et al.'s reverse-playing idea, as in
gym-sokoban): boxes start on their targets and the player walks and *pulls* boxes at random;
playing the recorded pulls forwards solves the room, so every room is solvable.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tokenergy.envs.text import TEXT_ENVS, TextEnv

__all__ = ["MOVES", "SokobanText", "parse_level", "solve"]

MOVES = ("Left", "Down", "Right", "Up")
_DELTA = ((0, -1), (1, 0), (0, 1), (-1, 0))
_MOVE_ID = {m.lower(): i for i, m in enumerate(MOVES)}

Pos = tuple[int, int]


def parse_level(rows: list[str]) -> tuple[set[Pos], set[Pos], set[Pos], Pos, tuple[int, int]]:
    """``(walls, targets, boxes, player, (height, width))`` of a level in the symbols above."""
    walls: set[Pos] = set()
    targets: set[Pos] = set()
    boxes: set[Pos] = set()
    player = None
    rows = [r.replace(" ", "") for r in rows]
    if not rows or any(len(r) != len(rows[0]) for r in rows):
        raise ValueError("sokoban: a level is a list of equal-length strings")
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch == "#":
                walls.add((r, c))
            elif ch in "O√S":
                targets.add((r, c))
            if ch in "X√":
                boxes.add((r, c))
            if ch in "PS":
                if player is not None:
                    raise ValueError("sokoban: a level has exactly one player (P or S)")
                player = (r, c)
            if ch not in "#_OX√PS":
                raise ValueError(f"sokoban: unknown symbol {ch!r} (use # _ O X √ P S)")
    if player is None:
        raise ValueError("sokoban: a level has exactly one player (P or S)")
    if not boxes or len(boxes) != len(targets):
        raise ValueError("sokoban: a level needs as many boxes as targets, at least one")
    return walls, targets, boxes, player, (len(rows), len(rows[0]))


def _push(walls: set[Pos], boxes: frozenset[Pos], player: Pos, a: int):
    """One move: ``(new_player, new_boxes)``; unchanged when blocked."""
    dr, dc = _DELTA[a]
    nxt = (player[0] + dr, player[1] + dc)
    if nxt in walls:
        return player, boxes
    if nxt in boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in walls or beyond in boxes:
            return player, boxes
        return nxt, (boxes - {nxt}) | {beyond}
    return nxt, boxes


def solve(
    walls: set[Pos], targets: set[Pos], boxes: set[Pos], player: Pos, max_states: int = 200_000
) -> list[int] | None:
    """Breadth-first search over (player, boxes): a shortest move sequence, or ``None``."""
    start = (player, frozenset(boxes))
    parent: dict = {start: None}
    todo = deque([start])
    goal = frozenset(targets)
    while todo:
        state = todo.popleft()
        if state[1] == goal:
            plan = []
            while parent[state] is not None:
                state, a = parent[state]
                plan.append(a)
            return plan[::-1]
        for a in range(4):
            nxt = _push(walls, state[1], state[0], a)
            if nxt not in parent:
                parent[nxt] = (state, a)
                if len(parent) > max_states:
                    return None
                todo.append(nxt)
    return None


class SokobanText(TextEnv):
    """Push every box onto a target.

    Args:
        size: side of a generated room (walls included), >= 5.
        num_boxes: boxes in a generated room.
        level: a fixed level (list of strings in the symbols above) instead of generating.
        reverse_steps: random backward steps when generating (more is harder).
        max_steps: moves before truncation.
        max_actions_per_turn: moves one turn may chain (``Up || Left``).
        invalid_penalty: reward of an invalid turn.
        plan_in_reasoning: the solver's scratchpad ends with its plan (``plan : Right Up``);
            without it the scratchpad only describes the state, so the decision falls to the
            action tokens.
        observation: ``grid`` (the room in the symbols above, row by row) or ``coords`` (the
            zero-indexed positions of the player, every box and every target first, then
            the grid).
        strict_format: a turn not exactly ``<think>…</think> <answer>…</answer>`` is invalid.
        extra_actions: ``invalid`` or ``drop`` (see :class:`~tokenergy.envs.text.TextEnv`).
    """

    name = "sokoban"
    instructions = "push every box X onto a target O . moves : Left Down Right Up"
    plan_marker = "plan :"
    OBSERVATIONS = ("grid", "coords")

    def __init__(
        self,
        size: int = 6,
        num_boxes: int = 1,
        level: list[str] | None = None,
        reverse_steps: int = 12,
        max_steps: int = 20,
        max_actions_per_turn: int = 1,
        invalid_penalty: float = -0.1,
        plan_in_reasoning: bool = True,
        observation: str = "grid",
        strict_format: bool = False,
        extra_actions: str = "invalid",
    ) -> None:
        super().__init__(
            max_steps, max_actions_per_turn, invalid_penalty, strict_format, extra_actions
        )
        self.observation_format = self.checked_observation(observation)
        self.plan_in_reasoning = plan_in_reasoning
        if level is None and size < 5:
            raise ValueError(f"sokoban: size must be >= 5, got {size}")
        if num_boxes < 1 or num_boxes > max(1, (size - 2) ** 2 // 4):
            raise ValueError(f"sokoban: num_boxes={num_boxes} does not fit a {size}x{size} room")
        self.level = level
        if level is not None:
            parse_level(level)  # fail at construction, not at reset
        self.size, self.num_boxes, self.reverse_steps = size, num_boxes, reverse_steps
        self.walls: set[Pos] = set()
        self.targets: set[Pos] = set()
        self.boxes: frozenset[Pos] = frozenset()
        self.player: Pos = (0, 0)
        self.shape = (size, size)
        self._plan: list[int] | None = None

    # ---- generation ------------------------------------------------------------------------

    def _generate(self) -> None:
        n = self.size
        while True:
            walls = {
                (r, c) for r in range(n) for c in range(n) if r in (0, n - 1) or c in (0, n - 1)
            }
            inner = [(r, c) for r in range(1, n - 1) for c in range(1, n - 1)]
            for i in self.rng.permutation(len(inner))[: int(self.rng.integers(0, 3))]:
                walls.add(inner[i])  # a few inner wall blocks
            free = [p for p in inner if p not in walls]
            picks = self.rng.permutation(len(free))[: self.num_boxes + 1]
            targets = {free[i] for i in picks[:-1]}
            boxes, player = set(targets), free[picks[-1]]
            for _ in range(self.reverse_steps * 4):  # walk backwards, pulling boxes
                a = int(self.rng.integers(4))
                dr, dc = _DELTA[a]
                nxt = (player[0] + dr, player[1] + dc)
                if nxt in walls or nxt in boxes:
                    continue
                behind = (player[0] - dr, player[1] - dc)
                if behind in boxes and self.rng.random() < 0.7:
                    boxes = (boxes - {behind}) | {player}  # the pull
                player = nxt
            if boxes != targets:
                plan = solve(walls, targets, boxes, player)
                if plan is not None and len(plan) <= self.max_steps:
                    self.walls, self.targets = walls, targets
                    self.boxes, self.player, self.shape = frozenset(boxes), player, (n, n)
                    return

    def _reset(self, options: dict) -> None:
        if self.level is not None:
            walls, targets, boxes, player, shape = parse_level(self.level)
            self.walls, self.targets, self.boxes = walls, targets, frozenset(boxes)
            self.player, self.shape = player, shape
        else:
            self._generate()
        self._plan = None

    # ---- dynamics --------------------------------------------------------------------------

    def _parse(self, move: str) -> int | None:
        return _MOVE_ID.get(move.strip().lower())

    def _apply(self, move: int) -> tuple[float, bool]:
        before = len(self.boxes & self.targets)
        self.player, self.boxes = _push(self.walls, self.boxes, self.player, move)
        after = len(self.boxes & self.targets)
        reward = -0.1 + (after - before) * 1.0
        if self.solved():
            return reward + 10.0, True
        if self._plan and self._plan[0] == move:
            self._plan = self._plan[1:]  # still on the solver's path
        else:
            self._plan = None
        return reward, False

    def solved(self) -> bool:
        return self.boxes == frozenset(self.targets)

    def render(self) -> str:
        rows = []
        for r in range(self.shape[0]):
            row = []
            for c in range(self.shape[1]):
                p, t, b = (r, c), (r, c) in self.targets, (r, c) in self.boxes
                if p in self.walls:
                    row.append("#")
                elif p == self.player:
                    row.append("S" if t else "P")
                elif b:
                    row.append("√" if t else "X")
                else:
                    row.append("O" if t else "_")
            rows.append(" ".join(row))
        grid = "\n".join(rows)
        if self.observation_format == "coords":
            return self.state_text() + " .\n" + grid
        return grid

    # ---- solver ----------------------------------------------------------------------------

    def plan(self) -> list[int] | None:
        """A shortest move sequence from the current state (cached while the agent follows it)."""
        if self._plan is None:
            self._plan = solve(self.walls, self.targets, set(self.boxes), self.player)
        return self._plan

    def solver_action(self) -> str:
        plan = self.plan()
        return MOVES[plan[0]] if plan else MOVES[0]  # a stuck room has no plan: any move

    def legal_actions(self) -> list[str]:
        return list(MOVES)

    def random_action(self, rng: np.random.Generator) -> str:
        return MOVES[int(rng.integers(4))]

    def state_text(self) -> str:
        """``player row 2 col 3 . box row 3 col 3 . target row 4 col 2`` (zero-indexed; the
        boxes not on a target, then the free targets, each sorted)."""
        loose = sorted(self.boxes - self.targets)
        empty = sorted(self.targets - self.boxes)
        parts = [f"player row {self.player[0]} col {self.player[1]}"]
        parts += [f"box row {r} col {c}" for r, c in loose]
        parts += [f"target row {r} col {c}" for r, c in empty]
        return " . ".join(parts)

    def reasoning(self) -> str:
        if not self.plan_in_reasoning:
            return self.state_text()
        plan = self.plan()
        moves = " ".join(MOVES[a] for a in plan[:4]) if plan else "stuck"
        return f"{self.state_text()} . plan : {moves}"

    @classmethod
    def vocabulary(cls) -> list[str]:
        symbols = ["#", "_", "O", "X", "√", "P", "S"]
        return [*MOVES, *symbols, "player", "box", "target", "row", "col", "plan", "stuck"]


@TEXT_ENVS.register("sokoban")
def _make_sokoban(**kwargs) -> SokobanText:
    return SokobanText(**kwargs)

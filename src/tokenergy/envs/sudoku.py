"""4x4 Sudoku as a text game: puzzles with a unique solution, one fill per move.

The grid has 2x2 boxes; digits 1–4, ``_`` for an empty cell. A move is ``r c v`` (1-based row,
column and value: ``2 3 4`` writes 4 in row 2, column 3), or ``r,c,v`` as the ActFocus paper
writes it. With ``observation="candidates"`` (the paper's form) the grid is followed by a line for
every empty cell with the digits still valid there (``row 2 col 3 can be 1 4``) and the solver
answers ``2,3,4``. Rewards: ``+1`` for a fill that
matches the solution, ``wrong_penalty`` for one that does not (the cell stays empty), the
invalid-turn penalty for an illegal move (a filled cell, out-of-range numbers, a digit already
in the row, column or box). Solved when the grid is full.
"""

from __future__ import annotations

import numpy as np

from tokenergy.envs.text import TEXT_ENVS, TextEnv

__all__ = ["Sudoku4Text", "candidates", "count_solutions"]

N = 4
_BASE = np.array([[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]])


def candidates(grid: np.ndarray, r: int, c: int) -> list[int]:
    """Digits that may go in empty cell ``(r, c)`` (0-based) without a row, column or box clash."""
    br, bc = 2 * (r // 2), 2 * (c // 2)
    used = set(grid[r]) | set(grid[:, c]) | set(grid[br : br + 2, bc : bc + 2].ravel())
    return [v for v in range(1, N + 1) if v not in used]


def count_solutions(grid: np.ndarray, limit: int = 2) -> int:
    """Solutions of ``grid`` (0 = empty) by backtracking, counting up to ``limit``."""
    empty = np.argwhere(grid == 0)
    if len(empty) == 0:
        return 1
    r, c = min(empty.tolist(), key=lambda rc: len(candidates(grid, *rc)))
    total = 0
    for v in candidates(grid, r, c):
        grid[r, c] = v
        total += count_solutions(grid, limit - total)
        grid[r, c] = 0
        if total >= limit:
            break
    return total


class Sudoku4Text(TextEnv):
    """Fill a 4x4 Sudoku with a unique solution.

    Args:
        num_holes: empty cells to aim for (fewer when uniqueness forbids more); 4–12.
        max_steps: moves before truncation.
        max_actions_per_turn: fills one turn may chain (``1 1 2 || 1 2 3``).
        invalid_penalty: reward of an invalid turn.
        wrong_penalty: reward of a legal fill that is not the solution's digit.
        observation: ``grid``, or ``candidates`` (the grid, then every empty cell's valid
            digits).
        plan_in_reasoning: the solver's scratchpad ends with the digit it fills (``fill 3``);
            without it the scratchpad states the cell and its candidates, and the answer
            decides.
        strict_format: a turn not exactly ``<think>…</think> <answer>…</answer>`` is invalid.
        extra_actions: ``invalid`` or ``drop`` (see :class:`~tokenergy.envs.text.TextEnv`).
    """

    name = "sudoku4"
    instructions = "fill the grid with 1 2 3 4 . move : row col value"
    plan_marker = "fill"
    OBSERVATIONS = ("grid", "candidates")

    def __init__(
        self,
        num_holes: int = 6,
        max_steps: int = 12,
        max_actions_per_turn: int = 1,
        invalid_penalty: float = -0.5,
        wrong_penalty: float = -0.5,
        observation: str = "grid",
        plan_in_reasoning: bool = True,
        strict_format: bool = False,
        extra_actions: str = "invalid",
    ) -> None:
        super().__init__(
            max_steps, max_actions_per_turn, invalid_penalty, strict_format, extra_actions
        )
        self.observation_format = self.checked_observation(observation)
        self.plan_in_reasoning = plan_in_reasoning
        if not 1 <= num_holes <= 12:
            raise ValueError(f"sudoku4: num_holes must be in [1, 12], got {num_holes}")
        self.num_holes = num_holes
        self.wrong_penalty = wrong_penalty
        self.grid = np.zeros((N, N), dtype=np.int64)
        self.solution = np.zeros((N, N), dtype=np.int64)

    def _reset(self, options: dict) -> None:
        rng = self.rng
        sol = _BASE.copy()
        sol = np.vectorize(dict(zip(range(1, 5), rng.permutation(4) + 1, strict=True)).get)(sol)
        bands = [list(rng.permutation(2) + 2 * b) for b in rng.permutation(2)]
        sol = sol[[i for band in bands for i in band]]
        stacks = [list(rng.permutation(2) + 2 * s) for s in rng.permutation(2)]
        sol = sol[:, [i for st in stacks for i in st]]
        if rng.random() < 0.5:
            sol = sol.T.copy()
        grid = sol.copy()
        holes = 0
        for idx in rng.permutation(N * N):
            if holes >= self.num_holes:
                break
            r, c = divmod(int(idx), N)
            keep = grid[r, c]
            grid[r, c] = 0
            if count_solutions(grid.copy()) == 1:
                holes += 1
            else:
                grid[r, c] = keep
        self.grid, self.solution = grid, sol

    def _parse(self, move: str) -> tuple[int, int, int] | None:
        parts = move.replace(",", " ").split()  # "2 3 4", "2,3,4" and "2 , 3 , 4" alike
        if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts):
            return None
        r, c, v = (int(p) for p in parts)
        if not (1 <= r <= N and 1 <= c <= N and 1 <= v <= N):
            return None
        r, c = r - 1, c - 1
        if self.grid[r, c] != 0 or v not in candidates(self.grid, r, c):
            return None
        return r, c, v

    def _apply(self, move: tuple[int, int, int]) -> tuple[float, bool]:
        r, c, v = move
        if self.grid[r, c] != 0 or v not in candidates(self.grid, r, c):
            return self.invalid_penalty, False  # a chained move made illegal by an earlier one
        if v != self.solution[r, c]:
            return self.wrong_penalty, False
        self.grid[r, c] = v
        return 1.0, self.solved()

    def solved(self) -> bool:
        return bool((self.grid != 0).all())

    def render(self) -> str:
        rows = [" ".join(str(v) if v else "_" for v in row) for row in self.grid]
        if self.observation_format == "candidates":
            rows += [
                f"row {r + 1} col {c + 1} can be {' '.join(map(str, candidates(self.grid, r, c)))}"
                for r, c in np.argwhere(self.grid == 0).tolist()
            ]
        return "\n".join(rows)

    def _pick(self) -> tuple[int, int]:
        empty = np.argwhere(self.grid == 0).tolist()
        return tuple(min(empty, key=lambda rc: (len(candidates(self.grid, *rc)), rc)))

    def _move_text(self, r: int, c: int, v: int) -> str:
        """A fill in this env's answer form: ``2,3,4`` (candidates) or ``2 3 4``."""
        sep = "," if self.observation_format == "candidates" else " "
        return sep.join(str(x) for x in (r, c, v))

    def solver_action(self) -> str:
        if self.solved():
            return self._move_text(1, 1, 1)
        r, c = self._pick()
        return self._move_text(r + 1, c + 1, int(self.solution[r, c]))

    def legal_actions(self) -> list[str]:
        return [
            self._move_text(r + 1, c + 1, v)
            for r, c in np.argwhere(self.grid == 0).tolist()
            for v in candidates(self.grid, r, c)
        ]

    def random_action(self, rng: np.random.Generator) -> str:
        r, c, v = (int(x) for x in rng.integers(1, N + 1, size=3))
        return self._move_text(r, c, v)

    def state_text(self) -> str:
        """``empty 5 . row 2 col 3 can be 1 4``: the empty cells, and the candidates of the
        cell the solver fills next (the one with the fewest)."""
        if self.solved():
            return "solved"
        r, c = self._pick()
        cands = " ".join(str(v) for v in candidates(self.grid, r, c))
        return f"empty {int((self.grid == 0).sum())} . row {r + 1} col {c + 1} can be {cands}"

    def reasoning(self) -> str:
        if self.solved() or not self.plan_in_reasoning:
            return self.state_text()
        r, c = self._pick()
        return f"{self.state_text()} . fill {self.solution[r, c]}"

    @classmethod
    def vocabulary(cls) -> list[str]:
        return ["_", "empty", "row", "col", "can", "be", "fill", "solved"]


@TEXT_ENVS.register("sudoku4")
def _make_sudoku4(**kwargs) -> Sudoku4Text:
    return Sudoku4Text(**kwargs)

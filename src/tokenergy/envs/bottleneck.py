"""The bottleneck gridworld: a wall with a narrow passage flanked by traps.

The agent starts top-left and must reach the goal bottom-right. A wall across the middle row
leaves a passage of ``passage_width`` cells; the wall cells right beside the passage are
traps that end the episode with a large negative reward. Crossing the passage is the one
decision that matters (the "action bottleneck"): most steps are easy, a few are decisive.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["ACTIONS", "BottleneckGridEnv"]

# (d_row, d_col); action ids follow Gymnasium's FrozenLake order: left, down, right, up.
ACTIONS: tuple[tuple[int, int], ...] = ((0, -1), (1, 0), (0, 1), (-1, 0))
EMPTY, WALL, TRAP, GOAL, START = ".", "#", "T", "G", "S"


class BottleneckGridEnv(gym.Env):
    """A ``size x size`` grid with a walled middle row, a narrow passage and traps beside it.

    Observation: one-hot of the agent's cell, ``float32[size * size]``. Actions: 0 left,
    1 down, 2 right, 3 up; moving into a wall or off the grid leaves the agent in place.
    Rewards: ``goal_reward`` on reaching the goal (terminated, ``info["success"] = True``),
    ``trap_reward`` on stepping into a trap (terminated, ``success = False``), else
    ``step_penalty`` (``success = False``). The time limit (``max_episode_steps`` at registration) truncates.

    Args:
        size: grid side (>= 4).
        passage_width: cells open in the wall row (>= 1).
        passage_col: leftmost passage column; ``None`` centres it.
        wall_row: row of the wall; ``None`` is ``size // 2``.
        traps: ``"beside"`` (the wall cells adjacent to the passage), ``"none"``, or an
            explicit list of ``(row, col)`` cells.
        goal_reward, trap_reward, step_penalty: the reward scheme.
        render_mode: ``"ansi"`` for a text rendering from :meth:`render`.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        size: int = 10,
        passage_width: int = 1,
        passage_col: int | None = None,
        wall_row: int | None = None,
        traps: str | Sequence[Sequence[int]] = "beside",
        goal_reward: float = 1.0,
        trap_reward: float = -1.0,
        step_penalty: float = -0.01,
        render_mode: str | None = None,
    ) -> None:
        if size < 4:
            raise ValueError(f"BottleneckGrid: size must be >= 4, got {size}")
        wall_row = size // 2 if wall_row is None else wall_row
        if not 1 <= wall_row <= size - 2:
            raise ValueError(f"BottleneckGrid: wall_row must be in [1, {size - 2}], got {wall_row}")
        if not 1 <= passage_width <= size - 1:
            raise ValueError(
                f"BottleneckGrid: passage_width must be in [1, {size - 1}], got {passage_width}"
            )
        passage_col = (size - passage_width) // 2 if passage_col is None else passage_col
        if not 0 <= passage_col <= size - passage_width:
            raise ValueError(
                f"BottleneckGrid: passage_col must be in [0, {size - passage_width}], got {passage_col}"
            )
        if render_mode not in (None, "ansi"):
            raise ValueError(
                f"BottleneckGrid: render_mode must be None or 'ansi', got {render_mode!r}"
            )

        grid = np.full((size, size), EMPTY, dtype="<U1")
        grid[wall_row, :] = WALL
        grid[wall_row, passage_col : passage_col + passage_width] = EMPTY
        if traps == "beside":
            trap_cells = [
                (wall_row, c)
                for c in (passage_col - 1, passage_col + passage_width)
                if 0 <= c < size
            ]
        elif traps == "none":
            trap_cells = []
        elif isinstance(traps, str):
            raise ValueError(
                f"BottleneckGrid: traps must be 'beside', 'none' or a list of cells, got {traps!r}"
            )
        else:
            trap_cells = [(int(r), int(c)) for r, c in traps]
        self.start = (0, 0)
        self.goal = (size - 1, size - 1)
        for r, c in trap_cells:
            if not (0 <= r < size and 0 <= c < size) or (r, c) in (self.start, self.goal):
                raise ValueError(
                    f"BottleneckGrid: trap cell {(r, c)} is off the grid or on start/goal"
                )
            grid[r, c] = TRAP
        grid[self.start] = START
        grid[self.goal] = GOAL
        self.grid = grid
        self.size = size
        self.goal_reward, self.trap_reward, self.step_penalty = (
            goal_reward,
            trap_reward,
            step_penalty,
        )
        self.render_mode = render_mode
        if self.shortest_path_length() is None:
            raise ValueError(
                "BottleneckGrid: the goal cannot be reached from the start with this layout"
            )

        self.observation_space = spaces.Box(0.0, 1.0, shape=(size * size,), dtype=np.float32)
        self.action_space = spaces.Discrete(len(ACTIONS))
        self.pos = self.start

    # -- helpers ---------------------------------------------------------------------------

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.size * self.size, dtype=np.float32)
        obs[self.pos[0] * self.size + self.pos[1]] = 1.0
        return obs

    def _moved(self, pos: tuple[int, int], action: int) -> tuple[int, int]:
        dr, dc = ACTIONS[action]
        r, c = pos[0] + dr, pos[1] + dc
        if not (0 <= r < self.size and 0 <= c < self.size) or self.grid[r, c] == WALL:
            return pos
        return (r, c)

    def shortest_path_length(self) -> int | None:
        """Steps of the shortest trap-free path from start to goal (BFS), or ``None``."""
        seen = {self.start: 0}
        queue = deque([self.start])
        while queue:
            pos = queue.popleft()
            if pos == self.goal:
                return seen[pos]
            for a in range(len(ACTIONS)):
                nxt = self._moved(pos, a)
                if nxt not in seen and self.grid[nxt] != TRAP:
                    seen[nxt] = seen[pos] + 1
                    queue.append(nxt)
        return None

    # -- Gymnasium API ---------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.pos = self.start
        return self._obs(), {"position": self.pos}

    def step(self, action: int):
        if not self.action_space.contains(action):
            raise ValueError(
                f"BottleneckGrid: action must be in [0, {len(ACTIONS) - 1}], got {action!r}"
            )
        self.pos = self._moved(self.pos, int(action))
        cell = self.grid[self.pos]
        info: dict[str, Any] = {"position": self.pos}
        if cell == GOAL:
            info["success"] = True
            return self._obs(), self.goal_reward, True, False, info
        if cell == TRAP:
            info["success"] = False
            info["trapped"] = True
            return self._obs(), self.trap_reward, True, False, info
        info["success"] = False  # so an episode cut by the time limit counts as a failure
        return self._obs(), self.step_penalty, False, False, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return self.to_text()

    def to_text(self) -> str:
        """The grid as text: ``A`` agent, ``S`` start, ``G`` goal, ``#`` wall, ``T`` trap."""
        rows = []
        for r in range(self.size):
            row = "".join("A" if (r, c) == self.pos else self.grid[r, c] for c in range(self.size))
            rows.append(row)
        return "\n".join(rows)


if "tokenergy/BottleneckGrid-v0" not in gym.registry:
    gym.register(
        id="tokenergy/BottleneckGrid-v0",
        entry_point="tokenergy.envs.bottleneck:BottleneckGridEnv",
        max_episode_steps=100,
        reward_threshold=0.8,
    )

"""The treasure hunt: rooms described in text, a key, a locked door and the treasure behind it.

Each level is a tree of rooms on a grid, grown at random from the start room (``difficulty``
sets the number of rooms: ``3 + 2 * difficulty``). The treasure lies in a leaf room behind a
locked door; the key lies in another room, never behind that door. The observation names the
room, what lies in it, its exits, what the agent carries and every legal action; with
``show_map`` (the default) the first observation opens with the map — every passage once,
and where the key and the treasure are — so the solver's plan can be read off the context:

    map : hall east library , hall south kitchen , library east vault locked . key : kitchen .
    treasure : vault .
    room kitchen . items : key . exits : north hall . carry : nothing .
    actions : go north || take key

Without the map the level is partially observable: the agent has to explore, and the
solver's scratchpad (which names the key's room and the route) is privileged.

Moves: ``go <direction>``, ``take key``, ``unlock <direction>`` (with the key, at the locked
door), ``take treasure``. Rewards: +5 for the key (once), +10 for the treasure (the episode
ends, success), -0.01 per move, -0.1 for an invalid turn (anything not among the listed
actions; the state is unchanged). The solver walks the tree: to the key, to the door, unlock,
in, take the treasure.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tokenergy.envs.text import TEXT_ENVS, TextEnv

__all__ = ["ROOM_NAMES", "TreasureHuntText"]

ROOM_NAMES = (
    "hall", "kitchen", "library", "cellar", "garden", "attic", "study", "vault", "gallery",
    "pantry", "chapel", "armory", "tower", "cave", "forge",
)  # fmt: skip
DIRECTIONS = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
MAX_DIFFICULTY = (len(ROOM_NAMES) - 3) // 2


class TreasureHuntText(TextEnv):
    """Find the key, unlock the door, take the treasure.

    Args:
        difficulty: 0 … 6; the level has ``3 + 2 * difficulty`` rooms.
        max_steps: moves before the episode is truncated.
        show_map: open each observation with the map (see the module docstring).
        key_reward, treasure_reward, step_penalty: the rewards above.
        invalid_penalty: reward of an invalid turn.
    """

    name = "treasure"
    instructions = "find the key , unlock the door and take the treasure"
    plan_marker = "route :"

    def __init__(
        self,
        difficulty: int = 1,
        max_steps: int = 30,
        key_reward: float = 5.0,
        treasure_reward: float = 10.0,
        step_penalty: float = 0.01,
        invalid_penalty: float = -0.1,
        show_map: bool = True,
    ) -> None:
        super().__init__(max_steps, 1, invalid_penalty)
        self.show_map = show_map
        if not 0 <= difficulty <= MAX_DIFFICULTY:
            raise ValueError(
                f"treasure: difficulty must be in [0, {MAX_DIFFICULTY}], got {difficulty}"
            )
        self.difficulty = difficulty
        self.key_reward = key_reward
        self.treasure_reward = treasure_reward
        self.step_penalty = step_penalty
        self.exits: dict[int, dict[str, int]] = {}

    # ---- the level -------------------------------------------------------------------------

    def _reset(self, options: dict) -> None:
        n = 3 + 2 * self.difficulty
        names = list(self.rng.permutation(ROOM_NAMES)[:n])
        cells = {(0, 0): 0}
        self.exits = {0: {}}
        while len(cells) < n:  # grow a tree: a new room beside a random existing one
            (r, c), room = list(cells.items())[int(self.rng.integers(len(cells)))]
            d = list(DIRECTIONS)[int(self.rng.integers(4))]
            cell = (r + DIRECTIONS[d][0], c + DIRECTIONS[d][1])
            if cell in cells:
                continue
            new = len(cells)
            cells[cell] = new
            self.exits[room][d] = new
            self.exits[new] = {OPPOSITE[d]: room}
        self.names = names
        leaves = [r for r in range(1, n) if len(self.exits[r]) == 1]
        self.treasure_room = int(leaves[int(self.rng.integers(len(leaves)))])
        (back,) = self.exits[self.treasure_room].values()
        self.door = (back, self.treasure_room)  # locked until unlocked from either side
        others = [r for r in range(n) if r not in (self.treasure_room, 0 if n > 3 else -1)]
        self.key_room: int | None = int(others[int(self.rng.integers(len(others)))])
        self.room = 0
        self.has_key = False
        self.unlocked = False
        self.treasure_taken = False

    def _locked(self, a: int, b: int) -> bool:
        return not self.unlocked and {a, b} == set(self.door)

    # ---- moves -----------------------------------------------------------------------------

    def legal_actions(self) -> list[str]:
        acts = []
        for d, other in sorted(self.exits[self.room].items()):
            acts.append(f"unlock {d}" if self._locked(self.room, other) else f"go {d}")
        if self.key_room == self.room:
            acts.append("take key")
        if self.room == self.treasure_room and not self.treasure_taken:
            acts.append("take treasure")
        return [a for a in acts if not a.startswith("unlock") or self.has_key]

    def _parse(self, move: str) -> str | None:
        move = move.lower()
        return move if move in self.legal_actions() else None

    def _apply(self, move: str) -> tuple[float, bool]:
        reward = -self.step_penalty
        verb, what = move.split()
        if verb == "go":
            self.room = self.exits[self.room][what]
        elif verb == "unlock":
            self.unlocked = True
        elif what == "key":
            self.key_room, self.has_key = None, True
            reward += self.key_reward
        else:
            self.treasure_taken = True
            return reward + self.treasure_reward, True
        return reward, False

    def solved(self) -> bool:
        return self.treasure_taken

    def render(self) -> str:
        items = [w for w, here in (("key", self.key_room == self.room),
                                   ("treasure", self.room == self.treasure_room and not self.treasure_taken)) if here]  # fmt: skip
        exits = " , ".join(
            f"{d} {self.names[o]}" + (" locked" if self._locked(self.room, o) else "")
            for d, o in sorted(self.exits[self.room].items())
        )
        here = (
            f"room {self.names[self.room]} . items : {' '.join(items) or 'none'} . "
            f"exits : {exits} . carry : {'key' if self.has_key else 'nothing'} .\n"
            f"actions : {' || '.join(self.legal_actions())}"
        )
        return here

    def observation(self) -> str:
        if self.show_map and self.steps == 0:
            return f"{self._map()}\n{self.render()}"
        return self.render()

    def _map(self) -> str:
        passages = []
        for a in sorted(self.exits):
            for d, b in sorted(self.exits[a].items()):
                if a < b:  # each passage once, from the room nearer the start
                    lock = " locked" if self._locked(a, b) else ""
                    passages.append(f"{self.names[a]} {d} {self.names[b]}{lock}")
        key, treasure = self.names[self.key_room], self.names[self.treasure_room]
        return f"map : {' , '.join(passages)} . key : {key} . treasure : {treasure} ."

    # ---- the solver ------------------------------------------------------------------------

    def _path(self, goal: int) -> list[str]:
        """Directions from the current room to ``goal`` through the tree (BFS)."""
        prev: dict[int, tuple[int, str] | None] = {self.room: None}
        queue = deque([self.room])
        while queue:
            r = queue.popleft()
            if r == goal:
                break
            for d, o in sorted(self.exits[r].items()):
                if o not in prev:
                    prev[o] = (r, d)
                    queue.append(o)
        path, r = [], goal
        while prev[r] is not None:
            r, d = prev[r]
            path.append(d)
        return path[::-1]

    def _subgoal(self) -> tuple[str, int]:
        if not self.has_key:
            return "key", self.key_room
        return "treasure", self.treasure_room

    def solver_action(self) -> str:
        if self.treasure_taken:
            return "take treasure"
        what, room = self._subgoal()
        if room == self.room:
            return f"take {what}"
        d = self._path(room)[0]
        if self._locked(self.room, self.exits[self.room][d]):
            return f"unlock {d}"
        return f"go {d}"

    def state_text(self) -> str:
        """``key in kitchen``: what to get next and the room it is in (``done`` at the end)."""
        if self.treasure_taken:
            return "done"
        what, room = self._subgoal()
        return f"{what} in {self.names[room]}"

    def reasoning(self) -> str:
        if self.treasure_taken:
            return "done"
        _, room = self._subgoal()
        path = self._path(room)
        route = " ".join(path) if path else "here"
        return f"{self.state_text()} . route : {route}"

    def random_action(self, rng: np.random.Generator) -> str:
        verbs = [f"go {d}" for d in DIRECTIONS] + [f"unlock {d}" for d in DIRECTIONS]
        verbs += ["take key", "take treasure"]
        return verbs[int(rng.integers(len(verbs)))]

    @classmethod
    def vocabulary(cls) -> list[str]:
        words = {*ROOM_NAMES, *DIRECTIONS, "room", "items", "exits", "carry", "actions", "go"}
        words |= {"take", "unlock", "key", "treasure", "locked", "none", "nothing", "route"}
        words |= {"here", "in", "done", "map", ",", ":", ".", "||"}
        return sorted(words | set(cls.instructions.split()))


TEXT_ENVS.register("treasure")(TreasureHuntText)

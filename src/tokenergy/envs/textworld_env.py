"""TextWorld games as a text env: text adventures that nobody here wrote.

Games are made offline by TextWorld's generator (``tw-make``, or :func:`make_games`, which
calls the same generator in-process) and played through its Python API. The observation is
the game's feedback followed by the admissible commands; an answer must be one of them
(case and spacing ignored), else the turn is invalid. The walkthrough from the current state
(TextWorld's ``policy_commands``) is the solver. Reward: the change of the game score;
success: the game is won; a lost game terminates.

Needs the optional ``textworld`` package (``make textworld``). The vocabulary of a game is
open, so the word-level tokenizer of the tiny models covers it only in part: train on
TextWorld with a pretrained tokenizer (``--model.pretrained smollm2-135m``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenergy.envs.text import TEXT_ENVS, TextEnv

__all__ = ["TextWorldText", "make_games"]


def _require_textworld():
    try:
        import textworld
    except ImportError:
        raise RuntimeError(
            "the textworld env needs the optional package: make textworld "
            "(or pip install textworld==1.7.0)"
        ) from None
    return textworld


def make_games(
    out_dir: str | Path,
    n: int = 4,
    seed: int = 0,
    world_size: int = 3,
    nb_objects: int = 5,
    quest_length: int = 3,
) -> list[Path]:
    """Generate ``n`` games with TextWorld's generator (as ``tw-make custom`` does) into ``out_dir``.

    ``quest_length`` is the difficulty knob: the number of commands the shortest win needs.
    Returns the game files (``.z8``), made once: existing files are reused.
    """
    textworld = _require_textworld()
    from textworld.generator import compile_game, make_game

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = out / f"tw-w{world_size}-o{nb_objects}-q{quest_length}-s{seed + i}.z8"
        if not path.is_file():
            options = textworld.GameOptions()
            options.seeds = seed + i
            options.nb_rooms = world_size
            options.nb_objects = nb_objects
            options.quest_length = quest_length
            options.path = str(path)
            options.force_recompile = True
            compile_game(make_game(options), options)
        paths.append(path)
    return paths


class TextWorldText(TextEnv):
    """Play TextWorld games; ``reset(seed=k)`` picks game ``k mod len(games)``.

    Args:
        games: game files (``.z8`` / ``.ulx``) made by ``tw-make`` or :func:`make_games`.
        game_dir: instead of ``games``, every game file in this folder.
        max_steps: commands before truncation.
        invalid_penalty: reward of an invalid turn.
    """

    name = "textworld"
    instructions = "win the text game . answer with one of the admissible commands"

    def __init__(
        self,
        games: list[str] | None = None,
        game_dir: str | None = None,
        max_steps: int = 30,
        invalid_penalty: float = -0.1,
    ) -> None:
        super().__init__(max_steps, 1, invalid_penalty)
        files = [Path(g) for g in games or []]
        if game_dir is not None:
            found = sorted(p for p in Path(game_dir).glob("*") if p.suffix in (".z8", ".ulx"))
            if not found:
                raise ValueError(
                    f"textworld: no .z8 or .ulx games in {game_dir!r}; make some with "
                    "`make textworld` (or tw-make)"
                )
            files += found
        if not files:
            raise ValueError("textworld: give games (a list of game files) or game_dir")
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise ValueError(f"textworld: game file not found: {missing[0]!r}")
        self.games = [str(p) for p in files]
        self._env: Any = None
        self._game: str | None = None
        self.state: Any = None
        self.history: list[str] = []
        self.score = 0
        self._first = ""

    def _start(self, game: str) -> None:
        textworld = _require_textworld()
        if self._env is not None and self._game == game:
            return
        if self._env is not None:
            self._env.close()
        infos = textworld.EnvInfos(
            admissible_commands=True,
            policy_commands=True,
            won=True,
            lost=True,
            max_score=True,
            objective=True,
            description=True,
        )
        self._env = textworld.start(game, request_infos=infos)
        self._game = game

    def _reset(self, options: dict) -> None:
        game = self.games[int(self.rng.integers(len(self.games)))]
        self._start(game)
        self.state = self._env.reset()
        self.history = []
        self.score = 0
        # The first feedback opens with an ASCII-art banner: show the goal and the room instead.
        self._first = f"{self.state.objective} {self.state.description}"

    def legal_actions(self) -> list[str]:
        return list(self.state.admissible_commands or [])

    def _parse(self, move: str) -> str | None:
        wanted = " ".join(move.lower().split())
        for cmd in self.state.admissible_commands or []:
            if " ".join(cmd.lower().split()) == wanted:
                return cmd
        return None

    def _apply(self, move: str) -> tuple[float, bool]:
        self.state, _, done = self._env.step(move)
        self.history.append(move)
        reward = float(self.state.score - self.score)
        self.score = self.state.score
        return reward, bool(done or self.state.won or self.state.lost)

    def solved(self) -> bool:
        return bool(self.state is not None and self.state.won)

    def render(self) -> str:
        text = self._first if not self.history else self.state.feedback or ""
        feedback = " ".join(text.split())
        cmds = " | ".join(self.state.admissible_commands or [])
        return f"{feedback}\nadmissible : {cmds}"

    def solver_action(self) -> str:
        plan = self.state.policy_commands or []
        return plan[0] if plan else (self.state.admissible_commands or ["look"])[0]

    def random_action(self, rng) -> str:
        cmds = self.state.admissible_commands or ["look"]
        return cmds[int(rng.integers(len(cmds)))]

    def reasoning(self) -> str:
        plan = self.state.policy_commands or []
        return f"score {self.score} of {self.state.max_score} . plan : {' , '.join(plan[:3])}"

    def clone(self) -> TextWorldText:
        """A fresh game process brought to the same state by replaying the commands."""
        twin = TextWorldText(self.games, None, self.max_steps, self.invalid_penalty)
        twin.rng.bit_generator.state = self.rng.bit_generator.state
        twin._start(self._game)
        twin.state = twin._env.reset()
        twin._first = self._first
        for cmd in self.history:
            twin._apply(cmd)
        twin.steps, twin.done = self.steps, self.done
        return twin

    @classmethod
    def vocabulary(cls) -> list[str]:
        return []  # open vocabulary: use a pretrained tokenizer


@TEXT_ENVS.register("textworld")
def _make_textworld(**kwargs) -> TextWorldText:
    return TextWorldText(**kwargs)

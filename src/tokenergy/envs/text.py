"""Multi-turn text environments: the contract, the action parser and the registry.

A text env speaks Gymnasium's semantics with strings: ``reset(*, seed=None, options=None) ->
(obs_text, info)`` and ``step(text) -> (obs_text, reward, terminated, truncated, info)``. The
agent's whole turn (``<think>…</think><answer>…</answer>``) is passed to ``step``; the env
reads the moves from the ``<answer>`` span. Anything it cannot use — no answer span, an empty
or over-long answer, an unknown move, unicode garbage, more moves than ``max_actions_per_turn``
(unless ``extra_actions="drop"``, the ActFocus paper's code: keep the first ones) — is an
*invalid* turn: ``invalid_penalty``, state unchanged, ``info["invalid"] = True``, and
it still counts against ``max_steps``. It never raises.

Every env also carries a scripted solver (:meth:`TextEnv.solver_action`), the scratchpad a
solver would write (:meth:`TextEnv.reasoning`, used for SFT data), its vocabulary (for the
tokenizer) and ``clone()`` (for search).

Perception: an env whose scratchpad opens with a description of the true state
(:meth:`TextEnv.state_text`, in the solver's words) lets an evaluation score what the agent
*says it sees*: :func:`stated_state` cuts the state part out of an agent turn (the reasoning up
to the env's ``plan_marker``, or all of it) and :func:`state_match` compares it word by word
with the truth.
"""

from __future__ import annotations

import abc
import copy
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from tokenergy.registry import Registry

__all__ = [
    "TEXT_ENVS",
    "TextEnv",
    "extract_answer",
    "format_turn",
    "split_actions",
    "state_match",
    "stated_state",
]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK = re.compile(r"<think>(.*?)(?:</think>|<answer>|$)", re.DOTALL)
# A whole turn in the required structure, nothing before or after it (strict_format).
_STRUCTURE = re.compile(
    r"\s*<think>(?:(?!<think>|<answer>).)*</think>\s*<answer>(?:(?!<answer>|</answer>).)*</answer>\s*$",
    re.DOTALL,
)
EXTRA_ACTIONS = ("invalid", "drop")  # what an answer with too many moves is (TextEnv)
MAX_TURN_CHARS = 4096  # a longer turn is invalid without being parsed further


def extract_answer(text: str) -> str | None:
    """The text inside the first ``<answer>…</answer>`` span, stripped; ``None`` when absent."""
    if not isinstance(text, str) or len(text) > MAX_TURN_CHARS:
        return None
    m = _ANSWER.search(text)
    return None if m is None else m.group(1).strip()


def split_actions(answer: str) -> list[str]:
    """``"Up || Left"`` → ``["Up", "Left"]`` (whitespace normalised, empty parts kept as ``""``)."""
    return [" ".join(part.split()) for part in answer.split("||")]


def stated_state(text: str, plan_marker: str | None) -> list[str]:
    """The words of the state an agent turn describes: its ``<think>`` span (up to
    ``</think>``, an ``<answer>`` or the end) cut before the first ``plan_marker``; no
    ``<think>``, no words. ``"<think> player row 2 col 3 . plan : Up </think>"`` with the
    marker ``"plan :"`` → ``["player", "row", "2", "col", "3"]``."""
    if not isinstance(text, str):
        return []
    m = _THINK.search(text[:MAX_TURN_CHARS])
    if m is None:
        return []
    words = m.group(1).split()
    if plan_marker:
        marker = plan_marker.split()
        for i in range(len(words) - len(marker) + 1):
            if words[i : i + len(marker)] == marker:
                words = words[:i]
                break
    while words and words[-1] == ".":  # the separator before the plan
        words.pop()
    return words


def state_match(said: list[str], truth: list[str]) -> tuple[bool, float]:
    """``(exact, share)``: whether ``said`` is ``truth`` word for word, and the share of
    positions where they agree, over the longer of the two (so missing and extra words both
    count against it). Two empty descriptions agree exactly."""
    n = max(len(said), len(truth))
    if n == 0:
        return True, 1.0
    right = sum(a == b for a, b in zip(said, truth, strict=False))
    return said == truth, right / n


def format_turn(reasoning: str, actions: list[str]) -> str:
    """The text a solver writes for one turn: ``<think> … </think> <answer> a || b </answer>``."""
    return f"<think> {reasoning} </think> <answer> {' || '.join(actions)} </answer>"


class TextEnv(abc.ABC):
    """Base class: parsing, the step budget, invalid-turn handling and cloning.

    Subclasses implement :meth:`_reset`, :meth:`_apply` (one parsed move), :meth:`_parse`
    (move text → move or ``None``), :meth:`render`, :meth:`solver_action`,
    :meth:`reasoning` and :meth:`vocabulary`.

    Args:
        max_steps: moves (valid or not) before the episode is truncated.
        max_actions_per_turn: moves one turn may chain with ``||``.
        invalid_penalty: reward of an invalid turn.
        strict_format: a turn that is not exactly ``<think>…</think> <answer>…</answer>``
            (the ActFocus paper's format check) is invalid too, answer or not.
        extra_actions: ``"invalid"``: an answer with more than ``max_actions_per_turn`` moves
            (or an empty one between two ``||``) is an invalid turn; ``"drop"``: empty parts
            are skipped and only the first ``max_actions_per_turn`` moves are played, as the
            code the ActFocus paper ran on (RAGEN) does.
    """

    name: str = "text"
    instructions: str = ""
    plan_marker: str | None = None  # where the plan starts in a scratchpad (perception)
    OBSERVATIONS: tuple[str, ...] = ("grid",)  # the observation formats the env can write

    def __init__(
        self,
        max_steps: int = 20,
        max_actions_per_turn: int = 1,
        invalid_penalty: float = -0.1,
        strict_format: bool = False,
        extra_actions: str = "invalid",
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn must be >= 1, got {max_actions_per_turn}")
        self.max_steps = max_steps
        self.max_actions_per_turn = max_actions_per_turn
        self.invalid_penalty = float(invalid_penalty)
        self.strict_format = bool(strict_format)
        if extra_actions not in EXTRA_ACTIONS:
            raise ValueError(
                f"{self.name}: extra_actions must be one of {', '.join(EXTRA_ACTIONS)}, "
                f"got {extra_actions!r}"
            )
        self.extra_actions = extra_actions
        self.steps = 0
        self.done = False
        self.rng = np.random.default_rng()

    # ---- the Gymnasium-style API ---------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Start an episode; the same seed gives the same level and the same dynamics."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.steps = 0
        self.done = False
        self._reset(options or {})
        return self.observation(), {}

    def step(self, text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one turn of agent text. Never raises on bad text (see the module docstring)."""
        if self.done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset()")
        moves = self._moves(text)
        info: dict[str, Any] = {"invalid": moves is None}
        reward, terminated = 0.0, False
        if moves is None:
            reward = self.invalid_penalty
            self.steps += 1
        else:
            for move in moves:
                r, terminated = self._apply(move)
                reward += r
                self.steps += 1
                if terminated or self.steps >= self.max_steps:
                    break
        truncated = not terminated and self.steps >= self.max_steps
        if terminated or truncated:
            self.done = True
            info["success"] = bool(self.solved())
        return self.observation(), float(reward), bool(terminated), bool(truncated), info

    def observation(self) -> str:
        return self.render()

    def clone(self) -> TextEnv:
        """An independent copy of the env, its state and its random generator (for search)."""
        return copy.deepcopy(self)

    def solver_turn(self) -> str:
        """The solver's whole turn text for the current state."""
        return format_turn(self.reasoning(), self.solver_moves())

    def solver_moves(self) -> list[str]:
        """The solver's moves for one turn: up to ``max_actions_per_turn`` of them, each the
        solver's move after the ones before (played out on a clone), stopping where the
        episode would end."""
        moves = [self.solver_action()]
        if self.max_actions_per_turn == 1:
            return moves
        twin = self.clone()
        for _ in range(self.max_actions_per_turn - 1):
            _, terminated = twin._apply(twin._parse(moves[-1]))
            twin.steps += 1
            if terminated or twin.steps >= self.max_steps:
                break
            moves.append(twin.solver_action())
        return moves

    def follows_solver(self, text: str) -> bool:
        """Whether the first move of the turn ``text`` is the scripted solver's move in the
        current state (ask before :meth:`step`). An invalid turn never follows."""
        moves = self._moves(text)
        return bool(moves) and moves[0] == self._parse(self.solver_action())

    def legal_actions(self) -> list[str]:
        """Every move text that is legal now, in a fixed order (for search)."""
        raise NotImplementedError(f"{self.name} does not list its legal actions")

    # ---- parsing ---------------------------------------------------------------------------

    def checked_observation(self, observation: str) -> str:
        """``observation`` if it is one of the env's ``OBSERVATIONS`` formats, else a
        ``ValueError`` that lists them."""
        if observation not in self.OBSERVATIONS:
            raise ValueError(
                f"{self.name}: observation must be one of {', '.join(self.OBSERVATIONS)}, "
                f"got {observation!r}"
            )
        return observation

    def state_text(self) -> str | None:
        """The true state in the words the solver's scratchpad opens with (what an agent
        that sees writes before its plan); ``None`` when the scratchpad has no state part."""
        return None

    def perceive(self, text: str) -> tuple[bool, float] | None:
        """Score the state an agent turn ``text`` describes against the true state (ask
        before :meth:`step`): :func:`state_match`'s ``(exact, share)``, or ``None`` when this
        env has no state description."""
        truth = self.state_text()
        if truth is None:
            return None
        return state_match(stated_state(text, self.plan_marker), truth.split())

    def _moves(self, text: Any) -> list[Any] | None:
        if self.strict_format and not (
            isinstance(text, str) and len(text) <= MAX_TURN_CHARS and _STRUCTURE.match(text)
        ):
            return None
        answer = extract_answer(text) if isinstance(text, str) else None
        if not answer:
            return None
        parts = split_actions(answer)
        if self.extra_actions == "drop":
            parts = [p for p in parts if p][: self.max_actions_per_turn]
        if not parts or len(parts) > self.max_actions_per_turn:
            return None
        moves = [self._parse(p) for p in parts]
        return None if any(m is None for m in moves) else moves

    # ---- to implement ----------------------------------------------------------------------

    @abc.abstractmethod
    def _reset(self, options: dict) -> None: ...

    @abc.abstractmethod
    def _parse(self, move: str) -> Any | None:
        """One move's text → the env's move, or ``None`` when it is not a legal move here."""

    @abc.abstractmethod
    def _apply(self, move: Any) -> tuple[float, bool]:
        """Apply one legal move; return ``(reward, terminated)``."""

    @abc.abstractmethod
    def solved(self) -> bool: ...

    @abc.abstractmethod
    def render(self) -> str: ...

    @abc.abstractmethod
    def solver_action(self) -> str:
        """The scripted solver's next move, as the text an agent would put in ``<answer>``."""

    @abc.abstractmethod
    def random_action(self, rng: np.random.Generator) -> str:
        """A uniformly random move's text (legal or not), for noisy demonstrations."""

    @abc.abstractmethod
    def reasoning(self) -> str:
        """A short scratchpad: the state described and the plan, as a solver would think it."""

    @classmethod
    @abc.abstractmethod
    def vocabulary(cls) -> list[str]:
        """Every word this env's observations and solver turns use (for the tokenizer)."""


TEXT_ENVS: Registry[Callable[..., TextEnv]] = Registry("text environment")

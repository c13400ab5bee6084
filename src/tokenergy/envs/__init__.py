"""Environments. Importing this package registers the ``tokenergy/*`` Gymnasium ids and the
text envs of :func:`make` (``frozenlake``, ``sokoban``, ``sudoku4``, ``textworld``,
``tree_search``, ``treasure``)."""

from __future__ import annotations

from typing import Any

from tokenergy.envs.bottleneck import BottleneckGridEnv
from tokenergy.envs.frozenlake import FrozenLakeText
from tokenergy.envs.sokoban import SokobanText
from tokenergy.envs.sudoku import Sudoku4Text
from tokenergy.envs.text import TEXT_ENVS, TextEnv
from tokenergy.envs.textworld_env import TextWorldText
from tokenergy.envs.treasure import TreasureHuntText
from tokenergy.envs.tree_search import TreeSearchText
from tokenergy.envs.vector import BatchedEnv, EpisodeStats, StepResult

__all__ = [
    "TEXT_ENVS",
    "BatchedEnv",
    "BottleneckGridEnv",
    "EpisodeStats",
    "FrozenLakeText",
    "SokobanText",
    "StepResult",
    "Sudoku4Text",
    "TextEnv",
    "TextWorldText",
    "TreasureHuntText",
    "TreeSearchText",
    "make",
]


def make(name: str, **kwargs: Any) -> TextEnv:
    """Build a registered text env by name: ``make("sokoban", size=6)``."""
    return TEXT_ENVS.get(name)(**kwargs)

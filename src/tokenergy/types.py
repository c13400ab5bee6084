"""Shared types and the shape glossary.

Shapes are written once here and referred to everywhere else:

- ``B``: trajectories in a batch (environments for vector PPO, sequences for LM agents)
- ``T``: steps (vector envs) or tokens (text envs) along a trajectory
- ``V``: vocabulary size; for a vector env the discrete action set plays that part (``V = A``)
- ``A``: discrete actions
- ``N``: flat samples (``N = B * T``) or tree nodes, as the docstring says

All tensors are batch-first: ``[B, T]`` for per-step quantities, ``[B, T, V]`` for logits.
"""

from __future__ import annotations

import enum

__all__ = ["Role"]


class Role(enum.IntEnum):
    """Who wrote a token, and therefore how the loss treats it.

    Roles live in a ``[B, T]`` int tensor beside the loss mask. ``PROMPT`` and ``OBSERVATION``
    are written by the environment and never trained; ``REASONING`` sits inside
    ``<think>…</think>``, ``ACTION`` inside ``<answer>…</answer>``, ``FORMAT`` is the tags.
    A step of a vector-observation env is one ``ACTION`` token.
    """

    PROMPT = 0
    OBSERVATION = 1
    REASONING = 2
    ACTION = 3
    FORMAT = 4

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

    Roles live in a ``[B, T]`` int tensor beside the loss mask. ``OBSERVATION`` is the prompt
    and every text the environment writes: never trained. ``REASONING`` is what the agent
    writes inside ``<think>…</think>`` (and any stray text outside the tags), ``ACTION`` what
    it writes inside ``<answer>…</answer>``, ``FORMAT`` the tag tokens themselves and the
    end-of-sequence token. A step of a vector-observation env is one ``ACTION`` token.
    """

    OBSERVATION = 0
    REASONING = 1
    ACTION = 2
    FORMAT = 3

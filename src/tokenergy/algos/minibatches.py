"""The update's loop, shared by every trainer that steps over minibatches (vector PPO, the LM
trainer, the pipeline's PPO): epochs of shuffled minibatches, one guarded step each, and the
counts of the steps the envelope skipped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

RATIO_CAPPED = "ratio_capped"  # a step's answer: over the ratio cap, not taken
SKIPPED = "skipped"  # a step's answer: not finite, not taken (or rolled back)

Step = Callable[[torch.Tensor], "dict[str, Any] | str"]


@dataclass
class MinibatchStats:
    """What :func:`minibatch_epochs` did: the sums of the taken steps' metrics, their number,
    and the steps the ratio cap or the finiteness guard skipped."""

    sums: dict[str, float] = field(default_factory=dict)
    updates: int = 0
    ratio_capped: int = 0
    skipped: int = 0

    def means(self) -> defaultdict:
        """Each metric's mean over the taken steps (NaN for a metric no step gave)."""
        n = max(self.updates, 1)
        return defaultdict(lambda: float("nan"), {k: v / n for k, v in self.sums.items()})


def minibatch_epochs(
    size: int,
    epochs: int,
    minibatches: int,
    generator: torch.Generator,
    step: Step,
    stop: Callable[[dict[str, Any]], bool] | None = None,
) -> MinibatchStats:
    """``epochs`` passes over ``size`` items, each a fresh permutation (``torch.randperm`` from
    ``generator``) cut into minibatches of ``size // minibatches`` items (the last one shorter
    when it does not divide). ``step(idx)`` takes one step on the items ``idx`` and returns its
    metrics, or :data:`RATIO_CAPPED` / :data:`SKIPPED` when it took none; ``stop(metrics)``
    true after a step ends the loop (an early stop on the KL)."""
    stats = MinibatchStats()
    mb = max(1, size // minibatches)
    for _epoch in range(epochs):
        perm = torch.randperm(size, generator=generator)
        for start in range(0, size, mb):
            out = step(perm[start : start + mb])
            if out == RATIO_CAPPED:
                stats.ratio_capped += 1
                continue
            if out == SKIPPED:
                stats.skipped += 1
                continue
            for k, v in out.items():
                stats.sums[k] = stats.sums.get(k, 0.0) + float(v)
            stats.updates += 1
            if stop is not None and stop(out):
                return stats
    return stats

"""What every config section shares: :class:`ConfigError`, fields with one line of help
(:func:`_f`), the range and condition checks, the log section and the run-level checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, out of range or incompatible."""

    def __init__(self, field_path: str, message: str) -> None:
        self.field_path = field_path
        self.message = message
        super().__init__(f"{field_path}: {message}" if field_path else message)

    def prefixed(self, prefix: str) -> ConfigError:
        path = f"{prefix}.{self.field_path}" if self.field_path else prefix
        return ConfigError(path, self.message)


def _f(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, (list, dict, tuple)) and not isinstance(default, tuple):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


def _check(cond: bool, name: str, message: str) -> None:
    if not cond:
        raise ConfigError(name, message)


def _in_range(
    value: float, name: str, lo: float | None, hi: float | None, *, lo_open=False, hi_open=False
) -> None:
    ok = True
    if lo is not None:
        ok &= value > lo if lo_open else value >= lo
    if hi is not None:
        ok &= value < hi if hi_open else value <= hi
    if not ok:
        left = ("(" if lo_open else "[") + ("-inf" if lo is None else f"{lo:g}")
        right = ("inf" if hi is None else f"{hi:g}") + (")" if hi_open else "]")
        raise ConfigError(name, f"must be in {left}, {right}, got {value!r}")


@dataclass
class LogConfig:
    """What a run writes besides metrics.jsonl."""

    episode_window: int = _f(
        20, "episodes averaged in rollout/return, rollout/length, rollout/success"
    )
    checkpoint_every: int = _f(0, "iterations between checkpoints; 0 writes only the final one")
    keep_checkpoints: int = _f(2, "how many of the newest checkpoints to keep")
    tensorboard: bool = _f(True, "also write TensorBoard events")
    progress: bool = _f(True, "show a progress bar")

    def __post_init__(self) -> None:
        _in_range(self.episode_window, "episode_window", 1, None)
        _in_range(self.checkpoint_every, "checkpoint_every", 0, None)
        _in_range(self.keep_checkpoints, "keep_checkpoints", 1, None)


def _check_run_fields(cfg: Any, kind: str) -> None:
    _check(cfg.kind == kind, "kind", f"must be {kind!r} for this config type, got {cfg.kind!r}")
    _in_range(cfg.seed, "seed", 0, 2**31 - 1)
    _check(
        cfg.device in ("cpu", "cuda", "auto") or cfg.device.startswith("cuda:"),
        "device",
        f"must be cpu, cuda, cuda:N or auto, got {cfg.device!r}",
    )


def _default_variants() -> dict:
    return {
        "ppo": {"energy.weighting": "none"},
        "energy": {"energy.weighting": "bottleneck"},
        "shuffled": {"energy.weighting": "bottleneck", "energy.shuffle": True},
    }


@dataclass
class AblationConfig:
    """Variants compared by ``tokenergy ablate`` and how the report scores them."""

    variants: dict = field(
        default_factory=_default_variants,
        metadata={"help": "name -> overrides applied to the base config"},
    )
    threshold_metric: str = _f(
        "rollout/success", "metric whose first crossing of threshold counts as 'solved'"
    )
    threshold: float = _f(0.9, "value of threshold_metric that counts as solved")

    def __post_init__(self) -> None:
        _check(
            isinstance(self.variants, dict) and len(self.variants) > 0,
            "variants",
            "must map at least one variant name to a dict of overrides",
        )
        for name, overrides in self.variants.items():
            _check(
                isinstance(overrides, dict),
                f"variants.{name}",
                "must be a dict of 'section.field: value'",
            )
        _check_folder_names(self.variants, "variants")


def _check_folder_names(table: dict, section: str) -> None:
    """Variant and env names of an ablation name folders: no ``/`` or ``\\``, not empty."""
    for name in table:
        _check(
            isinstance(name, str) and name.strip() != "" and not set("/\\") & set(name),
            f"{section}.{name}",
            "names a run folder: use a name without '/' or '\\'",
        )

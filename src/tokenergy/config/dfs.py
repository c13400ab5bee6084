"""The learning-to-search trainer's config (``kind: dfs``, :class:`DFSRunConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenergy.config.fields import (
    AblationConfig,
    LogConfig,
    _check,
    _check_run_fields,
    _f,
    _in_range,
)

# how key depth may enter the search transformer's scores, and its parameter blocks that take an
# initial scale (model.block_init) or a learning-rate share (train.block_lr)
DEPTH_FEATURES = ("none", "relative", "sinusoidal")
INIT_BLOCKS = ("u", "b", "values")
LR_BLOCKS = ("u", "e", "b", "rho", "values", "bias", "slope", "sines")


def _check_blocks(given: dict, name: str, blocks: tuple[str, ...]) -> None:
    """A ``{block: value >= 0}`` map over the named parameter blocks."""
    for key, value in given.items():
        _check(key in blocks, name, f"unknown block {key!r} (blocks: {', '.join(blocks)})")
        _check(isinstance(value, int | float) and value >= 0, name,
               f"{key}: must be a number >= 0, got {value!r}")  # fmt: skip


@dataclass
class TreeConfig:
    """The ``tree_search`` task the search transformer trains on."""

    k: int = _f(2, "children per internal node, 2 ... 9")
    goal: str = _f("uniform", "goal leaf distribution: uniform or zipf")
    zipf_s: float = _f(1.0, "zipf exponent (goal: zipf)")
    gamma: float = _f(1.0, "discount of the goal reward per move (< 1 rewards short searches)")

    def __post_init__(self) -> None:
        _in_range(self.k, "k", 2, 9)
        _check(
            self.goal in ("uniform", "zipf"), "goal", f"must be uniform or zipf, got {self.goal!r}"
        )
        _in_range(self.zipf_s, "zipf_s", 0.0, None)
        _in_range(self.gamma, "gamma", 0.0, 1.0, lo_open=True)


@dataclass
class SearchModelConfig:
    """The one-layer attention-only search transformer."""

    heads: int = _f(2, "attention heads")
    init_scale: float = _f(
        0.1, "std of the random initial weights (the depth embedding starts at 0)"
    )
    depth_embedding: bool = _f(
        True, "learn the one-hot depth embedding of the keys; false keeps it at 0 (relations only)"
    )
    window: int | None = _f(
        None, "attempts before the current one that attention may read; null reads them all"
    )
    depth_features: str = _f(
        "none",
        "a key score from the key's depth minus the decision's, shared across depths: none, "
        "relative (a learned slope per head) or sinusoidal (a learned projection of sinusoids)",
    )
    recency_init: float = _f(
        0.0, "initial rho of every head: keys lose softplus(rho) of score per attempt ago"
    )
    block_init: dict = _f(
        {}, "initial std of a block in place of init_scale: {u: 0.0} starts the token scores at 0"
    )

    def __post_init__(self) -> None:
        _in_range(self.heads, "heads", 1, 64)
        _in_range(self.init_scale, "init_scale", 0.0, None)
        _check(
            self.depth_features in DEPTH_FEATURES,
            "depth_features",
            f"must be one of {', '.join(DEPTH_FEATURES)}, got {self.depth_features!r}",
        )
        _check_blocks(self.block_init, "block_init", INIT_BLOCKS)
        if self.window is not None:
            _in_range(self.window, "window", 1, None)


@dataclass
class SearchTrainConfig:
    """REINFORCE with a batch-mean baseline over a depth curriculum."""

    depths: list = _f(
        [1, 2],
        "curriculum: tree depths, trained in this order; a list such as [1, 2] in place of a "
        "depth mixes those depths in one batch (equal shares)",
    )
    iterations: list = _f([150, 1500], "curriculum: iterations at each depth")
    batch: int = _f(128, "episodes per iteration")
    budget_frac: float | None = _f(
        None,
        "training leaf budget as a share of the k^d leaves (at least 1 leaf); null: all k^d. "
        "Evaluation always allows k^d",
    )
    lr: float = _f(0.1, "Adam learning rate")
    block_lr: dict = _f(
        {},
        "a block's share of lr (u, e, b, rho, values, bias, slope, sines): {values: 0.1} lets the "
        "scores move first, {u: 0.0} keeps the token scores where they start",
    )
    stage_heads: list | None = _f(
        None,
        "heads trained in each curriculum stage, e.g. [[0], [1]]: the others stay as they are "
        "(and attention_stage<i>.png shows each stage's heads); null trains every head throughout",
    )
    ent_coef: float = _f(0.0, "entropy bonus coefficient")
    max_grad_norm: float = _f(1.0, "global gradient-norm clip")

    def __post_init__(self) -> None:
        _check(
            len(self.depths) == len(self.iterations) and len(self.depths) > 0,
            "iterations",
            f"needs one count per curriculum depth ({len(self.depths)}), got {self.iterations}",
        )
        for d in self.depths:
            mixed = d if isinstance(d, list) else [d]
            _check(
                len(mixed) > 0 and all(isinstance(x, int) and 1 <= x <= 16 for x in mixed),
                "depths",
                f"must be ints in [1, 16] or lists of them, got {d!r}",
            )
            _check(
                self.batch % len(mixed) == 0,
                "batch",
                f"{self.batch} episodes do not split over the {len(mixed)} depths {d}",
            )
        if self.budget_frac is not None:
            _in_range(self.budget_frac, "budget_frac", 0.0, 1.0, lo_open=True)
        for n in self.iterations:
            _check(isinstance(n, int) and n >= 0, "iterations", f"must be ints >= 0, got {n!r}")
        _in_range(self.batch, "batch", 2, None)
        _check_blocks(self.block_lr, "block_lr", LR_BLOCKS)
        if self.stage_heads is not None:
            _check(
                len(self.stage_heads) == len(self.depths)
                and all(isinstance(hs, list) and hs and all(isinstance(h, int) and h >= 0 for h in hs)
                        for hs in self.stage_heads),
                "stage_heads",
                f"needs a non-empty list of head indices per curriculum stage ({len(self.depths)}), "
                f"got {self.stage_heads}",
            )  # fmt: skip
        _in_range(self.lr, "lr", 0.0, 1.0, lo_open=True)
        _in_range(self.ent_coef, "ent_coef", 0.0, None)
        _in_range(self.max_grad_norm, "max_grad_norm", 0.0, None, lo_open=True)


@dataclass
class SearchEvalConfig:
    """What ``tokenergy search-eval`` measures by default."""

    depths: list = _f([3, 4, 5, 6], "tree depths evaluated (deeper than any trained)")
    episodes: int = _f(256, "episodes per depth")

    def __post_init__(self) -> None:
        _in_range(self.episodes, "episodes", 1, None)


@dataclass
class DFSRunConfig:
    """A search transformer learning depth-first search by RL (arXiv:2606.00183)."""

    kind: str = _f("dfs", "dfs: an attention-only transformer learns to search a tree by RL")
    name: str = _f("tree-dfs", "run name, used for the default run folder")
    seed: int = _f(0, "the single seed of the run")
    device: str = _f("cpu", "torch device (the model is tiny: cpu)")
    tree: TreeConfig = field(default_factory=TreeConfig, metadata={"help": "the task"})
    model: SearchModelConfig = field(
        default_factory=SearchModelConfig, metadata={"help": "the transformer"}
    )
    train: SearchTrainConfig = field(
        default_factory=SearchTrainConfig, metadata={"help": "REINFORCE and the curriculum"}
    )
    eval: SearchEvalConfig = field(
        default_factory=SearchEvalConfig, metadata={"help": "evaluation"}
    )
    log: LogConfig = field(default_factory=LogConfig, metadata={"help": "logging"})
    ablation: AblationConfig = field(
        default_factory=lambda: AblationConfig(
            variants={"1-head": {"model.heads": 1}, "2-heads": {}, "4-heads": {"model.heads": 4}}
        ),
        metadata={"help": "tokenergy ablate: variants, each run then scored by search-eval"},
    )

    def __post_init__(self) -> None:
        _check_run_fields(self, "dfs")
        for heads in self.train.stage_heads or []:
            _check(
                max(heads) < self.model.heads,
                "train.stage_heads",
                f"head {max(heads)} of a {self.model.heads}-head model (heads count from 0)",
            )

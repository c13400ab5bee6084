"""Typed run configuration: dataclasses validated at construction, YAML presets, CLI overrides.

A config is built from a YAML preset (data only) plus ``--section.field value`` overrides and
saved, resolved, in the run folder. Every field has a default and one line of help (the
``help`` metadata); every bad value raises :class:`ConfigError` naming the field and what is
allowed, before any work starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CONFIG_KINDS",
    "AblationConfig",
    "AlgoConfig",
    "ConfigError",
    "EnergyConfig",
    "EnvConfig",
    "EvalConfig",
    "LMAblationConfig",
    "LMModelConfig",
    "LMRunConfig",
    "LogConfig",
    "ModelConfig",
    "PPOConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "TextEnvConfig",
    "TokenEnergyConfig",
    "apply_overrides",
    "config_class",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "parse_override_args",
    "save_config",
]


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


# --------------------------------------------------------------------------- sections


@dataclass
class EnvConfig:
    """Which environment, and how many copies step together."""

    id: str = _f(
        "tokenergy/BottleneckGrid-v0", "Gymnasium id of a discrete-action env (e.g. CartPole-v1)"
    )
    num_envs: int = _f(8, "environments stepped together in one batch")
    kwargs: dict = _f({}, "keyword arguments passed to gymnasium.make")

    def __post_init__(self) -> None:
        _check(bool(self.id), "id", "must name a Gymnasium env, e.g. CartPole-v1")
        _in_range(self.num_envs, "num_envs", 1, 4096)


@dataclass
class ModelConfig:
    """The MLP actor-critic for vector observations."""

    hidden_sizes: tuple = _f(
        (64, 64), "hidden layer widths of actor and critic (separate networks)"
    )
    activation: str = _f("tanh", "hidden activation: tanh or relu")

    def __post_init__(self) -> None:
        self.hidden_sizes = tuple(self.hidden_sizes)
        _check(
            len(self.hidden_sizes) > 0
            and all(isinstance(h, int) and h > 0 for h in self.hidden_sizes),
            "hidden_sizes",
            f"must be a non-empty list of positive ints, got {list(self.hidden_sizes)!r}",
        )
        _check(
            self.activation in ("tanh", "relu"),
            "activation",
            f"must be tanh or relu, got {self.activation!r}",
        )


@dataclass
class PPOConfig:
    """PPO with GAE, clipped policy and value losses (Schulman et al., 2017)."""

    total_steps: int = _f(200_000, "environment steps in the whole run (all envs together)")
    num_steps: int = _f(128, "steps per env per rollout; a batch is num_envs * num_steps")
    lr: float = _f(2.5e-4, "Adam learning rate")
    anneal_lr: bool = _f(True, "decay the learning rate linearly to 0 over the run")
    gamma: float = _f(0.99, "discount factor")
    lam: float = _f(0.95, "GAE lambda")
    epochs: int = _f(4, "optimisation epochs over each rollout batch")
    minibatches: int = _f(4, "minibatches per epoch")
    clip_eps: float = _f(0.2, "policy ratio clip range epsilon")
    clip_eps_high: float | None = _f(None, "upper clip range (clip-higher); null means clip_eps")
    value_clip: float | None = _f(0.2, "value clip range; null turns value clipping off")
    ent_coef: float = _f(0.01, "entropy bonus coefficient")
    vf_coef: float = _f(0.5, "value loss coefficient")
    max_grad_norm: float = _f(0.5, "global gradient-norm clip")
    norm_adv: bool = _f(True, "whiten advantages over the batch before the update")
    target_kl: float | None = _f(None, "stop the epoch loop early when approx_kl exceeds this")

    def __post_init__(self) -> None:
        _in_range(self.total_steps, "total_steps", 1, None)
        _in_range(self.num_steps, "num_steps", 1, None)
        _in_range(self.lr, "lr", 0.0, 1.0, lo_open=True)
        _in_range(self.gamma, "gamma", 0.0, 1.0)
        _in_range(self.lam, "lam", 0.0, 1.0)
        _in_range(self.epochs, "epochs", 1, None)
        _in_range(self.minibatches, "minibatches", 1, None)
        _in_range(self.clip_eps, "clip_eps", 0.0, 1.0, lo_open=True, hi_open=True)
        if self.clip_eps_high is not None:
            _in_range(self.clip_eps_high, "clip_eps_high", 0.0, None, lo_open=True)
        if self.value_clip is not None:
            _in_range(self.value_clip, "value_clip", 0.0, None, lo_open=True)
        _in_range(self.ent_coef, "ent_coef", 0.0, None)
        _in_range(self.vf_coef, "vf_coef", 0.0, None)
        _in_range(self.max_grad_norm, "max_grad_norm", 0.0, None, lo_open=True)
        if self.target_kl is not None:
            _in_range(self.target_kl, "target_kl", 0.0, None, lo_open=True)


@dataclass
class EnergyConfig:
    """Which energy is computed per step, and how it reshapes the policy loss."""

    source: str = _f(
        "advantage", "registered energy source: advantage, entropy, surprisal, free_energy"
    )
    weighting: str = _f(
        "none", "registered loss weighting: none (plain PPO) or bottleneck (z-score)"
    )
    beta: float = _f(5.0, "advantage energy sharpness: E = sigmoid(-beta * A) on whitened A")
    temperature: float = _f(1.0, "free-energy temperature")
    threshold_std: float = _f(1.5, "z-score above which a step counts as a bottleneck")
    weight_scale: float = _f(
        2.0, "weight of a bottleneck step (at the start of the weighted phase)"
    )
    weight_scale_final: float | None = _f(
        None, "weight_scale at the end of the run (linear); null keeps it"
    )
    smooth: bool = _f(False, "smooth sigmoid ramp instead of a hard step at threshold_std")
    shuffle: bool = _f(
        False, "control: permute the weights among steps, dropping the energy information"
    )
    warmup_frac: float = _f(0.2, "fraction of the run trained as plain PPO before weighting starts")

    def __post_init__(self) -> None:
        from tokenergy.energy import ENERGY_SOURCES, WEIGHTINGS

        _check(self.source in ENERGY_SOURCES, "source", ENERGY_SOURCES.unknown_message(self.source))
        _check(
            self.weighting in WEIGHTINGS, "weighting", WEIGHTINGS.unknown_message(self.weighting)
        )
        _in_range(self.beta, "beta", 0.0, None, lo_open=True)
        _in_range(self.temperature, "temperature", 0.0, None, lo_open=True)
        _in_range(self.weight_scale, "weight_scale", 0.0, None)
        if self.weight_scale_final is not None:
            _in_range(self.weight_scale_final, "weight_scale_final", 0.0, None)
        _in_range(self.warmup_frac, "warmup_frac", 0.0, 1.0, hi_open=True)
        if self.shuffle and self.weighting == "none":
            raise ConfigError(
                "shuffle", "shuffling uniform weights changes nothing; set energy.weighting too"
            )


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


@dataclass
class RunConfig:
    """One training run."""

    kind: str = _f("vector", "vector: PPO on a vector-observation Gymnasium env")
    name: str = _f("run", "run name, used for the default run folder")
    seed: int = _f(0, "the single seed of the run (model init, sampling, env resets)")
    device: str = _f("cpu", "torch device: cpu, cuda, cuda:N or auto")
    env: EnvConfig = field(default_factory=EnvConfig, metadata={"help": "environment"})
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "network"})
    ppo: PPOConfig = field(default_factory=PPOConfig, metadata={"help": "PPO"})
    energy: EnergyConfig = field(
        default_factory=EnergyConfig, metadata={"help": "energy weighting"}
    )
    log: LogConfig = field(default_factory=LogConfig, metadata={"help": "logging and checkpoints"})
    ablation: AblationConfig = field(default_factory=AblationConfig, metadata={"help": "ablation"})

    def __post_init__(self) -> None:
        _check_run_fields(self, "vector")
        batch = self.env.num_envs * self.ppo.num_steps
        if batch % self.ppo.minibatches:
            raise ConfigError(
                "ppo.minibatches",
                f"must divide the batch env.num_envs * ppo.num_steps = {batch}, got {self.ppo.minibatches}",
            )
        if self.ppo.total_steps < batch:
            raise ConfigError(
                "ppo.total_steps",
                f"must be at least one batch (env.num_envs * ppo.num_steps = {batch}), got {self.ppo.total_steps}",
            )

    @property
    def batch_size(self) -> int:
        return self.env.num_envs * self.ppo.num_steps

    @property
    def num_iterations(self) -> int:
        return self.ppo.total_steps // self.batch_size


def _check_run_fields(cfg: Any, kind: str) -> None:
    _check(cfg.kind == kind, "kind", f"must be {kind!r} for this config type, got {cfg.kind!r}")
    _in_range(cfg.seed, "seed", 0, 2**31 - 1)
    _check(
        cfg.device in ("cpu", "cuda", "auto") or cfg.device.startswith("cuda:"),
        "device",
        f"must be cpu, cuda, cuda:N or auto, got {cfg.device!r}",
    )


# --------------------------------------------------------------------------- LM agents


@dataclass
class TextEnvConfig:
    """Which text environment the language-model agent plays."""

    name: str = _f("frozenlake", "registered text env: frozenlake, sokoban, sudoku4")
    kwargs: dict = _f({}, "keyword arguments of the env (e.g. is_slippery: true)")
    max_turns: int = _f(10, "turns before an episode is truncated by the rollout")
    curriculum_kwarg: str | None = _f(
        None, "curriculum: the env keyword argument it raises (e.g. difficulty); null: none"
    )
    curriculum_values: list = _f([], "curriculum: the values of that argument, easiest first")
    curriculum_threshold: float = _f(
        0.8,
        "curriculum: rollout success (mean of the last curriculum_window iterations) to move on",
    )
    curriculum_window: int = _f(3, "curriculum: iterations averaged for the threshold")

    def __post_init__(self) -> None:
        from tokenergy.envs import TEXT_ENVS

        _check(self.name in TEXT_ENVS, "name", TEXT_ENVS.unknown_message(self.name))
        try:
            TEXT_ENVS.get(self.name)(**self.kwargs)
        except (TypeError, ValueError) as err:
            said = str(err)  # most envs name themselves in their errors already
            raise ConfigError(
                "kwargs", said if said.startswith(f"{self.name}:") else f"{self.name}: {said}"
            ) from None
        _in_range(self.max_turns, "max_turns", 1, None)
        if self.curriculum_kwarg is not None:
            _check(
                len(self.curriculum_values) >= 2,
                "curriculum_values",
                "a curriculum needs at least 2 values, easiest first",
            )
            for v in self.curriculum_values:
                try:
                    TEXT_ENVS.get(self.name)(**{**self.kwargs, self.curriculum_kwarg: v})
                except (TypeError, ValueError) as err:
                    raise ConfigError("curriculum_values", f"{self.name}: {err}") from None
        _in_range(self.curriculum_threshold, "curriculum_threshold", 0.0, 1.0)
        _in_range(self.curriculum_window, "curriculum_window", 1, None)


@dataclass
class LMModelConfig:
    """The policy: a named size built from scratch, or a local model folder."""

    size: str = _f("tiny", "tiny (~0.1M), small (~0.9M) or base (~5M) parameters")
    arch: str = _f(
        "llama",
        "architecture of a model built from scratch: llama (rotary positions) or gpt2 "
        "(learned absolute positions)",
    )
    grid: bool = _f(
        False,
        "llama built from scratch: observation tokens also get learned row / column "
        "embeddings (tokenergy.models.grid), so the agent can read where things are in a grid",
    )
    path: str | None = _f(
        None, "local folder of a saved agent or any Hugging Face causal LM; null builds one"
    )
    pretrained: str | None = _f(
        None, "a registered pretrained model (smollm2-135m, offline); overrides size"
    )
    lora_r: int = _f(0, "LoRA rank; 0 trains every weight")
    lora_alpha: int = _f(16, "LoRA scale numerator (scale = alpha / r)")
    lora_targets: list = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj"], "module names that get LoRA adapters"
    )
    train_top_blocks: int | None = _f(
        None,
        "RL: train only the top k transformer blocks (and the final norm, LM head and value "
        "head); embeddings and lower blocks freeze. null trains everything",
    )
    critic: str = _f(
        "shared",
        "ppo's value head reads the policy's last hidden state (shared), or a copy of the "
        "policy's transformer made when RL starts and trained at algo.value_lr (separate)",
    )

    def __post_init__(self) -> None:
        from tokenergy.models.lm import MODEL_SIZES
        from tokenergy.models.pretrained import PRETRAINED

        if self.pretrained is not None:
            _check(
                self.pretrained in PRETRAINED,
                "pretrained",
                PRETRAINED.unknown_message(self.pretrained),
            )
            _check(self.path is None, "path", "set either model.path or model.pretrained, not both")
        _in_range(self.lora_r, "lora_r", 0, None)
        _in_range(self.lora_alpha, "lora_alpha", 1, None)
        if self.train_top_blocks is not None:
            _in_range(self.train_top_blocks, "train_top_blocks", 0, None)

        _check(
            self.size in MODEL_SIZES,
            "size",
            f"must be one of {', '.join(MODEL_SIZES)}, got {self.size!r}",
        )
        _check(self.arch in ("llama", "gpt2"), "arch", f"must be llama or gpt2, got {self.arch!r}")
        _check(
            not self.grid or self.arch == "llama",
            "grid",
            f"row / column embeddings are built for arch llama, not {self.arch!r}",
        )
        _check(
            self.critic in ("shared", "separate"),
            "critic",
            f"must be shared or separate, got {self.critic!r}",
        )


@dataclass
class SFTConfig:
    """Supervised warm start on the scripted solver's episodes, with epsilon-noise."""

    episodes: int = _f(512, "solver episodes in the SFT data; 0 skips SFT")
    epsilon: float = _f(0.1, "chance that a demonstrated move is replaced by a random one")
    epochs: int = _f(4, "passes over the SFT data")
    batch_size: int = _f(32, "episodes per SFT step")
    lr: float = _f(3e-3, "AdamW learning rate of SFT")

    def __post_init__(self) -> None:
        _in_range(self.episodes, "episodes", 0, None)
        _in_range(self.epsilon, "epsilon", 0.0, 1.0)
        _in_range(self.epochs, "epochs", 1, None)
        _in_range(self.batch_size, "batch_size", 1, None)
        _in_range(self.lr, "lr", 0.0, 1.0, lo_open=True)


@dataclass
class RolloutConfig:
    """How episodes are sampled for each RL iteration."""

    episodes: int = _f(32, "episodes per iteration (all groups together)")
    group_size: int = _f(1, "episodes per env seed (GRPO's G); must divide episodes")
    temperature: float = _f(1.0, "sampling temperature")
    top_p: float = _f(1.0, "nucleus sampling threshold")
    max_turn_tokens: int = _f(48, "tokens the agent may write in one turn")
    max_tokens: int = _f(1024, "longest trajectory in tokens; longer episodes are truncated")
    instructions: bool = _f(
        False, "open each episode with the env's one-line instructions (for pretrained models)"
    )
    replay_ratio: float = _f(
        0.0,
        "success replay (ppo, reinforce): successful episodes replayed per new episode, "
        "e.g. 0.25 adds 8 to a batch of 32; 0 turns it off",
    )
    replay_size: int = _f(256, "success replay: the most recent successes kept")
    keep_groups: float = _f(
        1.0,
        "reward-variance filter (StarPO-S, the ActFocus paper's protocol: 0.25): train on "
        "this share of the env-seed groups, those whose episodes' returns vary most; 1 keeps all",
    )
    curiosity_coef: float = _f(
        0.0,
        "curiosity bonus: reward each turn with this times the surprise (mean NLL) of the "
        "environment's reply under a small next-observation model; 0 off",
    )

    def __post_init__(self) -> None:
        _in_range(self.episodes, "episodes", 1, None)
        _in_range(self.replay_ratio, "replay_ratio", 0.0, 4.0)
        _in_range(self.replay_size, "replay_size", 1, None)
        _in_range(self.keep_groups, "keep_groups", 0.0, 1.0, lo_open=True)
        _in_range(self.curiosity_coef, "curiosity_coef", 0.0, None)
        _in_range(self.group_size, "group_size", 1, None)
        _in_range(self.temperature, "temperature", 0.0, None, lo_open=True)
        _in_range(self.top_p, "top_p", 0.0, 1.0, lo_open=True)
        _in_range(self.max_turn_tokens, "max_turn_tokens", 4, None)
        _in_range(self.max_tokens, "max_tokens", 16, None)
        if self.episodes % self.group_size:
            raise ConfigError(
                "group_size",
                f"must divide rollout.episodes = {self.episodes}, got {self.group_size}",
            )


@dataclass
class AlgoConfig:
    """The RL update over tokens: PPO (value head, GAE), GRPO or REINFORCE with a baseline."""

    name: str = _f("ppo", "registered algorithm: ppo, grpo or reinforce")
    iterations: int = _f(50, "RL iterations (rollout + update)")
    lr: float = _f(1e-4, "AdamW learning rate of the policy in the RL phase")
    value_lr: float = _f(
        1e-3, "AdamW learning rate of the value head (ppo); it starts at zero and must catch up"
    )
    epochs: int = _f(2, "passes over each rollout batch")
    minibatches: int = _f(4, "minibatches per pass")
    clip_eps: float = _f(0.2, "ratio clip range")
    clip_eps_high: float | None = _f(None, "upper clip range (clip-higher); null means clip_eps")
    gamma: float = _f(1.0, "discount per token")
    lam: float = _f(0.95, "GAE lambda (ppo)")
    vf_coef: float = _f(0.5, "value-loss coefficient (ppo)")
    value_clip: float | None = _f(
        None, "value clip range (ppo); null (default) turns it off: returns here span ~10"
    )
    value_scale: float = _f(
        1.0,
        "ppo: the value is the value head's output times this, so a head that starts at 0 "
        "predicts returns / value_scale (about the returns' spread, e.g. 10 on Sokoban)",
    )
    ent_coef: float = _f(0.0, "entropy bonus coefficient")
    kl_coef: float = _f(0.02, "weight of the KL to the frozen reference; 0 turns it off")
    kl_kind: str = _f("k1", "KL estimator: k1, k2 or k3")
    kl_in: str = _f("reward", "where the KL goes: reward (per-token penalty) or loss")
    max_grad_norm: float = _f(1.0, "global gradient-norm clip")
    norm_adv: bool = _f(True, "whiten advantages over the trained tokens of the batch")
    loss_normalize: str = _f(
        "mask",
        "what the weighted policy loss is divided by: mask (the trained tokens' count) or "
        "weights (the sum of their weights, as the ActFocus paper)",
    )
    group_scale: str = _f(
        "group",
        "grpo: what divides an episode's return minus its group's mean: group (the group's "
        "std, as GRPO), batch (the batch's std) or none. With group, a group that failed every "
        "episode turns its small step-penalty differences into unit advantages",
    )
    critic_warmup_iters: int = _f(
        0, "ppo: first RL iterations that train only the value head (the policy waits)"
    )
    clip_eps_final: float | None = _f(
        None, "clip-range schedule: clip_eps moves linearly to this by the last iteration"
    )
    ent_coef_final: float | None = _f(
        None, "entropy-coefficient schedule: ent_coef moves linearly to this by the last iteration"
    )
    kl_target: float | None = _f(
        None,
        "adaptive KL: kl_coef moves toward this mean per-token KL to the reference "
        "(Ziegler et al.); null keeps kl_coef fixed",
    )
    kl_horizon: float = _f(256.0, "adaptive KL: episodes over which a 20% error moves kl_coef 20%")
    reward_whiten: bool = _f(
        False,
        "envelope: clip each turn's env reward to mean ± reward_clip·std of the batch, "
        "then divide by std",
    )
    reward_clip: float = _f(3.0, "envelope: reward_whiten's clip, in batch standard deviations")
    ratio_cap: float | None = _f(
        5.0,
        "envelope: skip a minibatch step whose mean probability ratio exceeds this; null off",
    )
    precision: str = _f(
        "fp32", "envelope: fp32, or bf16 (autocast of the scoring and update forward passes)"
    )
    value_target_tau: float | None = _f(
        None,
        "ppo: a target value head, soft-updated by this fraction each iteration, gives "
        "the values of GAE; null uses the value head itself",
    )
    sft_coef: float = _f(
        0.0, "SFT anchor: weight of the solver-demonstration NLL mixed into the RL loss; 0 off"
    )
    sft_coef_final: float | None = _f(
        None, "SFT anchor: sft_coef moves linearly to this by the last iteration (decay)"
    )

    def __post_init__(self) -> None:
        from tokenergy.advantages import ALGORITHMS

        _check(self.name in ALGORITHMS, "name", ALGORITHMS.unknown_message(self.name))
        _in_range(self.iterations, "iterations", 0, None)
        _in_range(self.lr, "lr", 0.0, 1.0, lo_open=True)
        _in_range(self.value_lr, "value_lr", 0.0, 1.0, lo_open=True)
        _in_range(self.epochs, "epochs", 1, None)
        _in_range(self.minibatches, "minibatches", 1, None)
        _in_range(self.clip_eps, "clip_eps", 0.0, 1.0, lo_open=True, hi_open=True)
        if self.clip_eps_high is not None:
            _in_range(self.clip_eps_high, "clip_eps_high", 0.0, None, lo_open=True)
        _in_range(self.gamma, "gamma", 0.0, 1.0)
        _in_range(self.lam, "lam", 0.0, 1.0)
        _in_range(self.vf_coef, "vf_coef", 0.0, None)
        if self.value_clip is not None:
            _in_range(self.value_clip, "value_clip", 0.0, None, lo_open=True)
        _in_range(self.ent_coef, "ent_coef", 0.0, None)
        _in_range(self.kl_coef, "kl_coef", 0.0, None)
        _check(
            self.kl_kind in ("k1", "k2", "k3"),
            "kl_kind",
            f"must be k1, k2 or k3, got {self.kl_kind!r}",
        )
        _check(
            self.kl_in in ("reward", "loss"), "kl_in", f"must be reward or loss, got {self.kl_in!r}"
        )
        _check(
            self.loss_normalize in ("mask", "weights"),
            "loss_normalize",
            f"must be mask or weights, got {self.loss_normalize!r}",
        )
        _check(
            self.group_scale in ("group", "batch", "none"),
            "group_scale",
            f"must be group, batch or none, got {self.group_scale!r}",
        )
        _in_range(self.max_grad_norm, "max_grad_norm", 0.0, None, lo_open=True)
        _in_range(self.value_scale, "value_scale", 0.0, None, lo_open=True)
        _in_range(self.critic_warmup_iters, "critic_warmup_iters", 0, None)
        if self.clip_eps_final is not None:
            _in_range(self.clip_eps_final, "clip_eps_final", 0.0, 1.0, lo_open=True, hi_open=True)
        if self.ent_coef_final is not None:
            _in_range(self.ent_coef_final, "ent_coef_final", 0.0, None)
        if self.kl_target is not None:
            _in_range(self.kl_target, "kl_target", 0.0, None, lo_open=True)
            _check(self.kl_coef > 0, "kl_target", "needs kl_coef > 0 as its starting value")
        _in_range(self.kl_horizon, "kl_horizon", 0.0, None, lo_open=True)
        _in_range(self.reward_clip, "reward_clip", 0.0, None, lo_open=True)
        if self.ratio_cap is not None:
            _in_range(self.ratio_cap, "ratio_cap", 1.0, None, lo_open=True)
        _check(
            self.precision in ("fp32", "bf16"),
            "precision",
            f"must be fp32 or bf16, got {self.precision!r}",
        )
        if self.value_target_tau is not None:
            _in_range(self.value_target_tau, "value_target_tau", 0.0, 1.0, lo_open=True)
            _check(
                self.name == "ppo",
                "value_target_tau",
                f"only ppo has a value head, not {self.name}",
            )
        _in_range(self.sft_coef, "sft_coef", 0.0, None)
        if self.sft_coef_final is not None:
            _in_range(self.sft_coef_final, "sft_coef_final", 0.0, None)
        if self.critic_warmup_iters and self.name != "ppo":
            raise ConfigError(
                "critic_warmup_iters", f"only ppo has a value head to warm up, not {self.name}"
            )


@dataclass
class TokenEnergyConfig:
    """Per-token energy for LM agents and its uses: loss weights, shaped reward, prior."""

    source: str = _f(
        "ref_free_energy",
        "token energy source: ref_free_energy (the ActFocus paper's: -logsumexp of the frozen "
        "reference's logits), ref_surprisal, surprisal, entropy, free_energy, kl_ref, "
        "ngram_repeat, discriminator, advantage, uncertainty",
    )
    weighting: str = _f(
        "none",
        "loss weighting: none, actfocus (the paper's), actfocus_softmax (ours), bottleneck "
        "(z-score) or top_entropy",
    )
    shuffle: bool = _f(
        False, "control: permute the weights among tokens of the same role, dropping the energy"
    )
    alpha: float = _f(0.1, "actfocus, actfocus_softmax: weight of reasoning tokens, in [0, 1]")
    beta: float = _f(
        0.5, "actfocus: action tokens weigh 1 + beta * sigmoid(z-scored energy), beta >= 0"
    )
    lam: float = _f(0.5, "actfocus_softmax: redistribution strength in [0, 1]")
    lam_final: float | None = _f(
        None, "actfocus_softmax: lam at the end of the run (linear); null keeps it"
    )
    tau: float = _f(1.0, "actfocus_softmax: softmax temperature over the action tokens' energy")
    format_weight: float = _f(1.0, "actfocus, actfocus_softmax: weight of tag tokens")
    threshold_std: float = _f(1.5, "bottleneck: z-score above which a token is a bottleneck")
    weight_scale: float = _f(2.0, "bottleneck: weight of a bottleneck token")
    weight_scale_final: float | None = _f(
        None, "bottleneck: weight_scale at the end of the run (linear); null keeps it"
    )
    smooth: bool = _f(False, "bottleneck: sigmoid ramp instead of a hard step")
    top_rho: float = _f(0.2, "top_entropy: kept fraction of the trained tokens")
    reward_beta: float = _f(0.0, "shaped reward r_t - beta * standardized(E_t); 0 turns it off")
    prior_beta: float = _f(
        0.0, "prior: weight of KL(pi || pi_E), pi_E = softmax(log pi_ref / prior_tau); 0 is off"
    )
    prior_tau: float = _f(1.0, "prior temperature")
    beta_patience: int = _f(
        0,
        "beta controller: halve reward_beta and prior_beta after this many evaluations "
        "without a new best eval/success; 0 turns it off",
    )
    warmup_iters: int = _f(0, "RL iterations trained without weights, shaping or prior")
    adv_beta: float = _f(5.0, "advantage source sharpness: E = sigmoid(-adv_beta * A)")
    ngram: int = _f(3, "ngram_repeat: n-gram length")
    window: int = _f(4, "discriminator / uncertainty: tokens of context they read")

    def __post_init__(self) -> None:
        from tokenergy.energy import TOKEN_ENERGIES, TOKEN_WEIGHTINGS

        _check(self.source in TOKEN_ENERGIES, "source", TOKEN_ENERGIES.unknown_message(self.source))
        _check(
            self.weighting in TOKEN_WEIGHTINGS,
            "weighting",
            TOKEN_WEIGHTINGS.unknown_message(self.weighting),
        )
        _in_range(self.alpha, "alpha", 0.0, 1.0)
        _in_range(self.beta, "beta", 0.0, None)
        # Outside [0, 1] actfocus_softmax weights can turn negative (lam > 1) or stop summing to N_a.
        _in_range(self.lam, "lam", 0.0, 1.0)
        if self.lam_final is not None:
            _in_range(self.lam_final, "lam_final", 0.0, 1.0)
        _in_range(self.tau, "tau", 0.0, None, lo_open=True)
        _in_range(self.format_weight, "format_weight", 0.0, None)
        _in_range(self.weight_scale, "weight_scale", 0.0, None)
        if self.weight_scale_final is not None:
            _in_range(self.weight_scale_final, "weight_scale_final", 0.0, None)
        _in_range(self.top_rho, "top_rho", 0.0, 1.0, lo_open=True)
        _in_range(self.reward_beta, "reward_beta", 0.0, None)
        _in_range(self.prior_beta, "prior_beta", 0.0, None)
        _in_range(self.prior_tau, "prior_tau", 0.0, None, lo_open=True)
        _in_range(self.beta_patience, "beta_patience", 0, None)
        _in_range(self.warmup_iters, "warmup_iters", 0, None)
        _in_range(self.adv_beta, "adv_beta", 0.0, None, lo_open=True)
        _in_range(self.ngram, "ngram", 1, None)
        _in_range(self.window, "window", 1, None)
        if self.shuffle and self.weighting == "none":
            raise ConfigError(
                "shuffle", "shuffling uniform weights changes nothing; set energy.weighting too"
            )
        if self.reward_beta > 0 and self.source == "advantage":
            raise ConfigError(
                "reward_beta",
                "the advantage energy is computed from the advantages, so it cannot shape the "
                "rewards they are computed from; choose another energy.source",
            )

    @property
    def reads_reference(self) -> bool:
        return self.source in ("ref_surprisal", "kl_ref", "ref_free_energy")

    @property
    def needs_reference(self) -> bool:
        """Whether the run must keep a frozen reference for the energy's sake (a source that
        reads it is only logged, not computed, when nothing uses it and there is none)."""
        return (self.reads_reference and self.active) or self.prior_beta > 0

    @property
    def active(self) -> bool:
        """Whether the energy is used at all (otherwise it is only logged)."""
        return self.weighting != "none" or self.reward_beta > 0 or self.prior_beta > 0


@dataclass
class EvalConfig:
    """Held-out evaluation: env seeds the training never sees."""

    episodes: int = _f(64, "held-out episodes per evaluation")
    every: int = _f(10, "RL iterations between evaluations (and one at the start and end)")
    seed_offset: int = _f(1_000_000, "held-out env seeds start here (training seeds stay below)")
    temperature: float = _f(0.0, "sampling temperature of evaluation; 0 is greedy")
    maps: int = _f(
        0,
        "held-out maps the evaluation's episodes cycle through (the ActFocus paper: 32 maps x "
        "16 rollouts at temperature 0.5); 0: every episode a map of its own",
    )
    diagnose_seeds: int = _f(
        0, "action-bottleneck diagnostic at each evaluation: env seeds (0 turns it off)"
    )
    diagnose_group: int = _f(8, "action-bottleneck diagnostic: rollouts per env seed")
    keep_best: bool = _f(
        False, "save the agent of the best held-out evaluation so far in <run>/best/"
    )

    def __post_init__(self) -> None:
        _in_range(self.episodes, "episodes", 1, None)
        _in_range(self.every, "every", 1, None)
        _in_range(self.seed_offset, "seed_offset", 0, None)
        _in_range(self.temperature, "temperature", 0.0, None)
        _in_range(self.maps, "maps", 0, None)
        _in_range(self.diagnose_seeds, "diagnose_seeds", 0, None)
        _in_range(self.diagnose_group, "diagnose_group", 2, None)


def _default_lm_variants() -> dict:
    return {
        "ppo": {"energy.weighting": "none", "energy.shuffle": False},
        "actfocus": {"energy.weighting": "actfocus"},
    }


@dataclass
class LMAblationConfig:
    """Variants (and environments) compared by ``tokenergy ablate`` for LM agents."""

    variants: dict = field(
        default_factory=_default_lm_variants,
        metadata={"help": "name -> overrides applied to the base config"},
    )
    envs: dict = field(
        default_factory=dict,
        metadata={
            "help": "env label -> overrides (env.name, env.kwargs, ...); empty: the base env only"
        },
    )
    cells: dict = field(
        default_factory=dict,
        metadata={
            "help": "'env/variant' -> overrides for that env's variant alone, applied after "
            "the variant's (e.g. frozenlake/grpo: {rollout.keep_groups: 1.0})"
        },
    )
    metric: str = _f("eval/success", "metric whose final value the table reports")

    def __post_init__(self) -> None:
        _check(
            isinstance(self.variants, dict) and len(self.variants) > 0,
            "variants",
            "must map at least one variant name to a dict of overrides",
        )
        for cell in self.cells:
            env, _, variant = str(cell).partition("/")
            _check(
                variant in self.variants and (env in self.envs or not self.envs),
                f"cells.{cell}",
                f"must name an env of ablation.envs and a variant of ablation.variants as "
                f"'env/variant' (variants: {', '.join(self.variants)})",
            )
        for section, table in (
            ("variants", self.variants),
            ("envs", self.envs),
            ("cells", self.cells),
        ):
            for name, overrides in table.items():
                _check(
                    isinstance(overrides, dict),
                    f"{section}.{name}",
                    "must be a dict of 'section.field: value'",
                )


@dataclass
class LMRunConfig:
    """One language-model agent run: SFT warm start, then RL over tokens."""

    kind: str = _f("lm", "lm: a language-model agent in a text environment")
    name: str = _f("lm-run", "run name, used for the default run folder")
    seed: int = _f(0, "the single seed of the run (model init, sampling, env seeds)")
    device: str = _f("cpu", "torch device: cpu, cuda, cuda:N or auto")
    env: TextEnvConfig = field(default_factory=TextEnvConfig, metadata={"help": "environment"})
    model: LMModelConfig = field(default_factory=LMModelConfig, metadata={"help": "policy"})
    sft: SFTConfig = field(default_factory=SFTConfig, metadata={"help": "SFT warm start"})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": "sampling"})
    algo: AlgoConfig = field(default_factory=AlgoConfig, metadata={"help": "RL algorithm"})
    energy: TokenEnergyConfig = field(
        default_factory=TokenEnergyConfig, metadata={"help": "per-token energy and its uses"}
    )
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "evaluation"})
    log: LogConfig = field(default_factory=LogConfig, metadata={"help": "logging and checkpoints"})
    ablation: LMAblationConfig = field(
        default_factory=LMAblationConfig, metadata={"help": "ablation"}
    )

    def __post_init__(self) -> None:
        _check_run_fields(self, "lm")
        if self.algo.name == "grpo" and self.rollout.group_size < 2:
            raise ConfigError(
                "rollout.group_size",
                "GRPO needs at least 2 episodes per env seed (group-relative advantages of a "
                "group of one are 0); set rollout.group_size to 2 or more",
            )
        if self.rollout.replay_ratio > 0 and self.algo.name == "grpo":
            raise ConfigError(
                "rollout.replay_ratio",
                "success replay is for ppo and reinforce: a replayed episode has no group in "
                "GRPO's group-relative advantages",
            )
        if self.rollout.episodes % self.algo.minibatches:
            raise ConfigError(
                "algo.minibatches",
                f"must divide rollout.episodes = {self.rollout.episodes}, got {self.algo.minibatches}",
            )
        if self.model.critic == "separate" and self.algo.name != "ppo":
            raise ConfigError(
                "model.critic", f"only ppo has a value head to separate, not {self.algo.name}"
            )


# --------------------------------------------------------------------------- SLM pipeline


@dataclass
class CorpusConfig:
    """The synthetic corpora of the pipeline (:mod:`tokenergy.envs.corpora`)."""

    domain: str = _f("story", "domain of SFT, reward model and PPO: story, news or facts")
    train_docs: int = _f(2000, "documents of the domain for SFT, preference pairs and PPO prompts")
    heldout_docs: int = _f(200, "held-out documents (evaluation prompts and pairs)")
    pretrain_docs: int = _f(2000, "documents per domain (all three mixed) for pre-training")

    def __post_init__(self) -> None:
        from tokenergy.envs.corpora import DOMAINS

        _check(
            self.domain in DOMAINS,
            "domain",
            f"must be one of {', '.join(DOMAINS)}, got {self.domain!r}",
        )
        _in_range(self.train_docs, "train_docs", 8, None)
        _in_range(self.heldout_docs, "heldout_docs", 8, None)
        _in_range(self.pretrain_docs, "pretrain_docs", 0, None)


@dataclass
class SLMModelConfig:
    """The causal LM of the pipeline: built from scratch in a named size, or a local folder."""

    size: str = _f("tiny", "tiny (~0.1M), small (~0.9M) or base (~5M) parameters")
    path: str | None = _f(
        None,
        "a pre-trained causal LM folder (from an earlier run's pretrained/); skips pre-training",
    )
    lora_r: int = _f(8, "LoRA rank of the SFT adapter and of the fresh PPO adapter")
    lora_alpha: int = _f(16, "LoRA scale numerator (scale = alpha / r)")
    lora_targets: list = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "module names that get LoRA adapters",
    )

    def __post_init__(self) -> None:
        from tokenergy.models.lm import MODEL_SIZES

        _check(
            self.size in MODEL_SIZES,
            "size",
            f"must be one of {', '.join(MODEL_SIZES)}, got {self.size!r}",
        )
        _in_range(self.lora_r, "lora_r", 1, None)
        _in_range(self.lora_alpha, "lora_alpha", 1, None)


@dataclass
class StageConfig:
    """A supervised stage: steps of AdamW on minibatches."""

    steps: int = _f(300, "optimizer steps; 0 skips the stage")
    batch_size: int = _f(32, "sequences (or pairs) per step")
    lr: float = _f(3e-3, "AdamW learning rate (linear decay to 0)")

    def __post_init__(self) -> None:
        _in_range(self.steps, "steps", 0, None)
        _in_range(self.batch_size, "batch_size", 1, None)
        _in_range(self.lr, "lr", 0.0, 1.0, lo_open=True)


@dataclass
class SLMPPOConfig:
    """PPO on prompt continuations scored by the reward model, KL to the SFT reference."""

    iterations: int = _f(40, "PPO iterations (rollout + update)")
    prompts: int = _f(32, "prompts (continuations) per iteration")
    max_new_tokens: int = _f(48, "longest continuation in tokens")
    temperature: float = _f(1.0, "sampling temperature of the rollouts")
    lr: float = _f(1e-3, "AdamW learning rate of the fresh LoRA adapter")
    value_lr: float = _f(1e-3, "AdamW learning rate of the value head")
    epochs: int = _f(2, "passes over each batch")
    minibatches: int = _f(2, "minibatches per pass")
    clip_eps: float = _f(0.2, "ratio clip range")
    value_clip: float | None = _f(0.2, "value clip range; null turns it off")
    vf_coef: float = _f(0.5, "value-loss coefficient")
    gamma: float = _f(1.0, "discount per token")
    lam: float = _f(0.95, "GAE lambda")
    kl_coef: float = _f(
        0.05, "per-token KL penalty to the frozen SFT reference (k1, in the reward)"
    )
    kl_target: float | None = _f(
        None, "adaptive KL: kl_coef moves toward this mean per-token KL; null keeps it fixed"
    )
    kl_horizon: float = _f(512.0, "adaptive KL: continuations over which it moves by the error")
    max_grad_norm: float = _f(1.0, "global gradient-norm clip")
    merge_reinit: bool = _f(
        True,
        "merge the SFT adapter into the weights and train a fresh adapter; false reloads the "
        "saved SFT adapter the plain peft way (frozen: only the value head learns)",
    )

    def __post_init__(self) -> None:
        _in_range(self.iterations, "iterations", 0, None)
        _in_range(self.prompts, "prompts", 1, None)
        _in_range(self.max_new_tokens, "max_new_tokens", 1, None)
        _in_range(self.temperature, "temperature", 0.0, None, lo_open=True)
        _in_range(self.lr, "lr", 0.0, 1.0, lo_open=True)
        _in_range(self.value_lr, "value_lr", 0.0, 1.0, lo_open=True)
        _in_range(self.epochs, "epochs", 1, None)
        _in_range(self.minibatches, "minibatches", 1, None)
        _in_range(self.clip_eps, "clip_eps", 0.0, 1.0, lo_open=True, hi_open=True)
        if self.value_clip is not None:
            _in_range(self.value_clip, "value_clip", 0.0, None, lo_open=True)
        _in_range(self.kl_coef, "kl_coef", 0.0, None)
        if self.kl_target is not None:
            _in_range(self.kl_target, "kl_target", 0.0, None, lo_open=True)
            _check(self.kl_coef > 0, "kl_target", "needs kl_coef > 0 as its starting value")
        _in_range(self.kl_horizon, "kl_horizon", 0.0, None, lo_open=True)
        _in_range(self.max_grad_norm, "max_grad_norm", 0.0, None, lo_open=True)
        if self.prompts % self.minibatches:
            raise ConfigError(
                "minibatches", f"must divide prompts = {self.prompts}, got {self.minibatches}"
            )


@dataclass
class EnvelopeConfig:
    """The safety envelope of PPO; each part switchable and logged when it acts."""

    reward_whiten: bool = _f(
        True, "clip reward-model scores to mean ± reward_clip·std of the batch, divide by std"
    )
    reward_clip: float = _f(3.0, "the clip, in batch standard deviations")
    ratio_cap: float | None = _f(
        5.0, "skip a minibatch step whose mean probability ratio exceeds this; null off"
    )
    rollback: bool = _f(
        True, "skip non-finite steps and roll back to the iteration's start when weights break"
    )
    precision: str = _f("fp32", "fp32, or bf16 (autocast of the PPO forward passes)")

    def __post_init__(self) -> None:
        _in_range(self.reward_clip, "reward_clip", 0.0, None, lo_open=True)
        if self.ratio_cap is not None:
            _in_range(self.ratio_cap, "ratio_cap", 1.0, None, lo_open=True)
        _check(
            self.precision in ("fp32", "bf16"),
            "precision",
            f"must be fp32 or bf16, got {self.precision!r}",
        )


@dataclass
class SLMEvalConfig:
    """Held-out evaluation of the SFT and the PPO models."""

    prompts: int = _f(128, "held-out prompts continued by each model")
    temperature: float = _f(1.0, "sampling temperature of the evaluated continuations")
    pairs: int = _f(200, "held-out preference pairs for the reward model's accuracy")

    def __post_init__(self) -> None:
        _in_range(self.prompts, "prompts", 1, None)
        _in_range(self.temperature, "temperature", 0.0, None, lo_open=True)
        _in_range(self.pairs, "pairs", 1, None)


@dataclass
class PipelineRunConfig:
    """SFT -> reward model -> PPO for a small causal LM on synthetic text (seed 004)."""

    kind: str = _f("pipeline", "pipeline: pre-train, SFT, reward model, PPO on synthetic text")
    name: str = _f("slm", "run name, used for the default run folder")
    seed: int = _f(0, "the single seed of the run (corpora, init, sampling)")
    device: str = _f("cpu", "torch device: cpu, cuda, cuda:N or auto")
    corpus: CorpusConfig = field(default_factory=CorpusConfig, metadata={"help": "corpora"})
    model: SLMModelConfig = field(default_factory=SLMModelConfig, metadata={"help": "the LM"})
    pretrain: StageConfig = field(
        default_factory=StageConfig, metadata={"help": "pre-training (full weights, all domains)"}
    )
    sft: StageConfig = field(
        default_factory=lambda: StageConfig(steps=200),
        metadata={"help": "SFT with LoRA on the domain (loss on continuations)"},
    )
    rm: StageConfig = field(
        default_factory=lambda: StageConfig(steps=200, lr=1e-3),
        metadata={"help": "Bradley-Terry reward model"},
    )
    ppo: SLMPPOConfig = field(default_factory=SLMPPOConfig, metadata={"help": "PPO"})
    envelope: EnvelopeConfig = field(
        default_factory=EnvelopeConfig, metadata={"help": "safety envelope"}
    )
    eval: SLMEvalConfig = field(default_factory=SLMEvalConfig, metadata={"help": "evaluation"})
    log: LogConfig = field(default_factory=LogConfig, metadata={"help": "logging"})
    stop_after: str | None = _f(
        None, "pretrain: stop once the pre-trained model is saved (to share it between runs)"
    )

    def __post_init__(self) -> None:
        _check_run_fields(self, "pipeline")
        _check(
            self.stop_after in (None, "pretrain"),
            "stop_after",
            f"must be null or pretrain, got {self.stop_after!r}",
        )
        if self.stop_after == "pretrain" and (self.model.path or self.pretrain.steps == 0):
            raise ConfigError("stop_after", "pretrain: there is no pre-training to stop after")


# --------------------------------------------------------------------------- learning to search


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

    def __post_init__(self) -> None:
        _in_range(self.heads, "heads", 1, 64)
        _in_range(self.init_scale, "init_scale", 0.0, None)
        if self.window is not None:
            _in_range(self.window, "window", 1, None)


@dataclass
class SearchTrainConfig:
    """REINFORCE with a batch-mean baseline over a depth curriculum."""

    depths: list = _f([1, 2], "curriculum: tree depths, trained in this order")
    iterations: list = _f([150, 1500], "curriculum: iterations at each depth")
    batch: int = _f(128, "episodes per iteration")
    lr: float = _f(0.1, "Adam learning rate")
    ent_coef: float = _f(0.0, "entropy bonus coefficient")
    max_grad_norm: float = _f(1.0, "global gradient-norm clip")

    def __post_init__(self) -> None:
        _check(
            len(self.depths) == len(self.iterations) and len(self.depths) > 0,
            "iterations",
            f"needs one count per curriculum depth ({len(self.depths)}), got {self.iterations}",
        )
        for d in self.depths:
            _check(
                isinstance(d, int) and 1 <= d <= 16, "depths", f"must be ints in [1, 16], got {d!r}"
            )
        for n in self.iterations:
            _check(isinstance(n, int) and n >= 0, "iterations", f"must be ints >= 0, got {n!r}")
        _in_range(self.batch, "batch", 2, None)
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


CONFIG_KINDS: dict[str, type] = {
    "vector": RunConfig,
    "lm": LMRunConfig,
    "pipeline": PipelineRunConfig,
    "dfs": DFSRunConfig,
}


# --------------------------------------------------------------------------- building


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is tuple:
        return "list"
    return getattr(tp, "__name__", str(tp))


# YAML 1.1 (PyYAML) reads 1e-4 and 3E5, numbers without a dot, as strings
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against a field type, converting only where it is lossless."""
    if tp in (int, float) and isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ConfigError:
                pass
        raise ConfigError(path, f"must be {_type_name(tp)}, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is tuple:
        if isinstance(value, (list, tuple)):
            return tuple(value)
    elif tp is dict:
        if isinstance(value, dict):
            return value
    else:  # pragma: no cover - only the types above are used in configs
        return value
    raise ConfigError(path, f"must be {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def _unknown_key(key: str, allowed: list[str], path: str) -> ConfigError:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    where = f"{path}." if path else ""
    return ConfigError(f"{where}{key}", f"unknown key{hint} (allowed: {', '.join(allowed)})")


def _build(cls: type, data: dict, path: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(path, f"must be a mapping of fields, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise _unknown_key(key, list(fields), path)
        sub = f"{path}.{key}" if path else key
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value or {}, sub)
        else:
            kwargs[key] = _coerce(value, tp, sub)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise (err.prefixed(path) if path else err) from None


def config_class(data: dict | None) -> type:
    """The config class a preset asks for with its ``kind`` (``vector`` unless said)."""
    kind = (data or {}).get("kind", "vector")
    if kind not in CONFIG_KINDS:
        raise ConfigError("kind", f"must be one of {', '.join(CONFIG_KINDS)}, got {kind!r}")
    return CONFIG_KINDS[kind]


def config_from_dict(data: dict | None) -> Any:
    """Build and validate a run config (:class:`RunConfig` or :class:`LMRunConfig`, by
    ``kind``) from nested plain data (a parsed YAML file)."""
    cfg = _build(config_class(data), data or {}, "")
    ablation = getattr(cfg, "ablation", None)
    for name, overrides in (ablation.variants if ablation else {}).items():
        try:
            apply_overrides(cfg, overrides)
        except ConfigError as err:
            raise ConfigError(f"ablation.variants.{name}.{err.field_path}", err.message) from None
    return cfg


def config_to_dict(cfg: Any) -> dict:
    """Plain nested data for YAML (tuples become lists)."""

    def plain(x: Any) -> Any:
        if isinstance(x, tuple):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list):
            return [plain(v) for v in x]
        return x

    return plain(dataclasses.asdict(cfg))


def apply_overrides(cfg: Any, overrides: dict[str, Any]) -> Any:
    """Return a new config with dotted-path overrides applied (``{"ppo.clip_eps": 0.1}``).

    Dashes in names are accepted for underscores (``ppo.clip-eps``). A path that goes on past a
    dict field sets one key of it (``env.kwargs.observation``), keeping the others. The result
    is validated as a whole, so incompatible combinations are caught too.
    """
    data = config_to_dict(cfg)
    env = data.get("env")
    new_env = {k.replace("-", "_"): v for k, v in overrides.items()}.get("env.name")
    if isinstance(env, dict) and "kwargs" in env and new_env not in (None, env.get("name")):
        env["kwargs"] = {}  # the arguments belonged to the other environment
    for dotted, value in overrides.items():
        parts = [p.replace("-", "_") for p in dotted.split(".")]
        node: Any = data
        cls: Any = type(cfg)
        for i, part in enumerate(parts):
            sub_path = ".".join(parts[: i + 1])
            parent_path = ".".join(parts[:i])
            if not (dataclasses.is_dataclass(cls) and isinstance(node, dict)):
                raise ConfigError(
                    sub_path, f"{parent_path} is not a section, it has no field {part!r}"
                )
            names = [f.name for f in dataclasses.fields(cls)]
            if part not in names:
                raise _unknown_key(part, names, parent_path)
            tp = typing.get_type_hints(cls)[part]
            if tp is dict and i < len(parts) - 1:  # a key inside a dict field (env.kwargs.size)
                node.setdefault(part, {})[".".join(parts[i + 1 :])] = value
                break
            if i == len(parts) - 1:
                if dataclasses.is_dataclass(tp):
                    raise ConfigError(
                        sub_path,
                        "is a section; override one of its fields, e.g. "
                        f"{sub_path}.{dataclasses.fields(tp)[0].name}",
                    )
                if tp is dict and isinstance(value, dict) and isinstance(node.get(part), dict):
                    node[part] = {**node[part], **value}
                else:
                    node[part] = value
            else:
                node = node.setdefault(part, {})
                cls = tp
    return _build(type(cfg), data, "")


def parse_override_args(args: list[str]) -> dict[str, Any]:
    """Parse ``["--ppo.clip-eps", "0.1", "--energy.shuffle=true"]`` into dotted overrides.

    Values are read as YAML scalars (``0.1`` → float, ``true`` → bool, ``[64, 64]`` → list,
    ``null`` → None). A flag with no value is ``true``.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(
                "",
                f"unexpected argument {arg!r}; the config file comes first, overrides look like --section.field VALUE",
            )
        key = arg[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            raw = args[i + 1]
            i += 2
        else:
            raw = "true"
            i += 1
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        out[key] = value
    return out


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> Any:
    """Read a YAML preset (or the defaults when ``path`` is None) and apply overrides."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("", f"config file {str(p)!r} not found")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError("", f"config file {str(p)!r} is not valid YAML: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError("", f"config file {str(p)!r} must hold a mapping of sections")
    cfg = config_from_dict(data)
    if overrides:
        cfg = apply_overrides(cfg, _stringly(cfg, overrides))
    return cfg


def _stringly(cfg: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """A CLI value for a ``str`` field stays a string even when YAML reads it as a number."""
    out = {}
    for dotted, value in overrides.items():
        parts = [p.replace("-", "_") for p in dotted.split(".")]
        cls: Any = type(cfg)
        tp: Any = None
        for part in parts:
            if not dataclasses.is_dataclass(cls):
                tp = None
                break
            hints = typing.get_type_hints(cls)
            tp = hints.get(part)
            cls = tp
        if tp is str and value is not None and not isinstance(value, str):
            value = str(value)
        out[dotted] = value
    return out


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))

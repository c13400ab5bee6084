"""The SFT → RM → PPO pipeline's config (``kind: pipeline``, :class:`PipelineRunConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenergy.config.fields import (
    ConfigError,
    LogConfig,
    _check,
    _check_run_fields,
    _f,
    _in_range,
)


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

"""The vector PPO trainer's config (``kind: vector``, :class:`RunConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenergy.config.fields import (
    AblationConfig,
    ConfigError,
    LogConfig,
    _check,
    _check_run_fields,
    _f,
    _in_range,
)


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

"""The LM trainer's config (``kind: lm``, :class:`LMRunConfig`): text env, model, SFT, rollout,
algorithm, token energy, evaluation and the ablation of an LM study.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenergy.config.fields import (
    ConfigError,
    LogConfig,
    _check,
    _check_folder_names,
    _check_run_fields,
    _f,
    _in_range,
)


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


def _states_its_state(env: TextEnvConfig) -> bool:
    """Whether ``env``'s solver scratchpad opens with the state (so eval/state_exact exists)."""
    from tokenergy.envs import TEXT_ENVS

    instance = TEXT_ENVS.get(env.name)(**env.kwargs)
    instance.reset(seed=0)
    return instance.state_text() is not None


@dataclass
class SFTConfig:
    """Supervised warm start on the scripted solver's episodes, with epsilon-noise."""

    episodes: int = _f(512, "solver episodes in the SFT data; 0 skips SFT")
    epsilon: float = _f(0.1, "chance that a demonstrated move is replaced by a random one")
    epochs: int = _f(4, "passes over the SFT data")
    batch_size: int = _f(32, "episodes per SFT step")
    lr: float = _f(3e-3, "AdamW learning rate of SFT")
    min_state_exact: float = _f(
        0.0,
        "perception gate: the share of held-out scratchpads that state the state word for word "
        "(eval/state_exact at iteration 0) the SFT agent must reach; below it SFT trains another "
        "round of `epochs` on the same demonstrations; 0 is no gate",
    )
    max_rounds: int = _f(1, "most SFT rounds while the agent stays below min_state_exact")

    def __post_init__(self) -> None:
        _in_range(self.episodes, "episodes", 0, None)
        _in_range(self.epsilon, "epsilon", 0.0, 1.0)
        _in_range(self.epochs, "epochs", 1, None)
        _in_range(self.batch_size, "batch_size", 1, None)
        _in_range(self.lr, "lr", 0.0, 1.0, lo_open=True)
        _in_range(self.min_state_exact, "min_state_exact", 0.0, 1.0)
        _in_range(self.max_rounds, "max_rounds", 1, None)


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
    truncation: str = _f(
        "bootstrap",
        "ppo: what follows an episode cut off by the turn limit or the env's step cap: "
        "bootstrap (the critic's value of the last observation) or terminal (nothing: the "
        "limit is part of the task, as in the ActFocus paper's GAE over whole trajectories)",
    )
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
    lr_final: float | None = _f(
        None,
        "learning-rate schedule: lr moves linearly to this by the last iteration (value_lr "
        "in the same proportion); null keeps lr fixed",
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
    null_returns: bool = _f(
        False,
        "control: each episode trains on the return of another of its batch (shuffled), so the "
        "advantages say nothing about what it did; a run learning from its reward beats this",
    )
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
            self.truncation in ("bootstrap", "terminal"),
            "truncation",
            f"must be bootstrap or terminal, got {self.truncation!r}",
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
        if self.lr_final is not None:
            _in_range(self.lr_final, "lr_final", 0.0, None)
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


# Energy sources that read the frozen reference: from it alone, and with the policy as well.
REFERENCE_ONLY_SOURCES = ("ref_surprisal", "ref_free_energy", "ref_entropy")
REFERENCE_SOURCES = (*REFERENCE_ONLY_SOURCES, "kl_ref", "logprob_shift")


@dataclass
class TokenEnergyConfig:
    """Per-token energy for LM agents and its uses: loss weights, shaped reward, prior."""

    source: str = _f(
        "ref_free_energy",
        "token energy source: ref_free_energy (the ActFocus paper's: -logsumexp of the frozen "
        "reference's logits), ref_surprisal, ref_entropy, logprob_shift (log pi_old - log "
        "pi_ref), surprisal, entropy, free_energy, kl_ref, ngram_repeat, discriminator, "
        "advantage, uncertainty",
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
        return self.source in REFERENCE_SOURCES

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
        _check_folder_names(self.variants, "variants")
        _check_folder_names(self.envs, "envs")
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
        if self.sft.min_state_exact > 0 and not _states_its_state(self.env):
            raise ConfigError(
                "sft.min_state_exact",
                f"{self.env.name}'s scratchpad states no state to check (this form has no "
                "state description); set it to 0",
            )
        if self.model.critic == "separate" and self.algo.name != "ppo":
            raise ConfigError(
                "model.critic", f"only ppo has a value head to separate, not {self.algo.name}"
            )

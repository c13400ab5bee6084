"""Language-model agents built locally: a word-level tokenizer, tiny decoder-only policies from
``transformers`` configs, a value head, and save / load from a local folder.

Nothing is downloaded. The tokenizer's vocabulary is the special tokens, digits, a little
punctuation and every word the registered text envs use, so any env text tokenizes without
``<unk>``; agent text outside it maps to ``<unk>``. It is a ``PreTrainedTokenizerFast``, so it
saves and loads like any Hugging Face tokenizer.

A saved agent folder holds ``policy/`` (``save_pretrained`` of the causal LM and the
tokenizer) and ``value_head.safetensors``; an agent with a separate critic
(:class:`CriticModel`, :func:`separate_critic`) also ``critic/``, the critic's transformer.
:func:`load_agent` also takes a plain Hugging Face causal-LM folder (a user's own checkpoint,
with its tokenizer): the value head then starts fresh.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tokenergy.models.tokenizer import build_tokenizer

__all__ = [
    "MODEL_SIZES",
    "AgentModel",
    "CriticModel",
    "ModelLoadError",
    "ValueHead",
    "agent_from_config",
    "build_agent",
    "causal_only",
    "load_agent",
    "save_agent",
    "separate_critic",
]


class ModelLoadError(RuntimeError):
    """A model folder is missing, incomplete or not a causal language model."""


# name -> (hidden, layers, heads, intermediate); parameter counts are for the default vocab
MODEL_SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (64, 2, 4, 192),  # ~0.1M
    "small": (128, 4, 4, 384),  # ~0.9M
    "base": (256, 6, 8, 768),  # ~5M
}


def _config(
    arch: str, size: str, vocab_size: int, tokenizer, max_positions: int, grid: bool = False
):
    from transformers import GPT2Config, LlamaConfig

    from tokenergy.models.grid import GridLlamaConfig, grid_token_ids

    if size not in MODEL_SIZES:
        raise ValueError(f"model size {size!r}: choose from {', '.join(MODEL_SIZES)}")
    hidden, layers, heads, inter = MODEL_SIZES[size]
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if grid and arch != "llama":
        raise ValueError("grid positions are built for the llama architecture only")
    if arch == "llama":
        kind, extra = (GridLlamaConfig, grid_token_ids(tokenizer)) if grid else (LlamaConfig, {})
        return kind(
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=max_positions,
            tie_word_embeddings=True,
            **ids,
            **extra,
        )
    if arch == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_inner=inter,
            n_positions=max_positions,
            resid_pdrop=0.0,  # no dropout: PPO ratios need train == eval forward passes
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **ids,
        )
    raise ValueError(f"model arch {arch!r}: choose llama or gpt2")


class ValueHead(nn.Module):
    """``V(h) = w2 · tanh(W1 h + b1) + b2``; the output layer starts at zero so V = 0 at init."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        nn.init.zeros_(self.net[2].weight)
        nn.init.zeros_(self.net[2].bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T)
        return self.net(hidden).squeeze(-1)


def causal_only(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """``None`` when every row of ``attention_mask`` is its real tokens followed by padding,
    else the mask.

    In a right-padded batch a real token attends only to earlier tokens, all real, so causal
    attention alone gives every real token the output the padding mask gives, and the
    attention kernel runs its causal path without building or reading a mask. Rows of our
    batches (collated episodes, SFT data) are right-padded.
    """
    if attention_mask is None:
        return None
    m = attention_mask.bool()
    return None if bool((m[:, 1:] <= m[:, :-1]).all()) else attention_mask


class CriticModel(nn.Module):
    """A value model with a transformer of its own: ``V = head(last hidden state of trunk)``.

    The value head of :class:`AgentModel` reads the policy's hidden state, features learned to
    predict the next token; this critic learns its own features (how hard is this map?) at
    the value learning rate, without moving the policy. :func:`separate_critic` builds it
    from the policy, so it starts with the policy's features and the agent's value head.
    """

    def __init__(self, trunk: nn.Module, head: ValueHead) -> None:
        super().__init__()
        self.trunk = trunk  # a transformers base model (no LM head): last_hidden_state
        self.head = head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        out = self.trunk(
            input_ids=input_ids, attention_mask=causal_only(attention_mask), use_cache=False
        )
        return self.head(out.last_hidden_state)


@dataclass
class AgentOutput:
    logits: torch.Tensor  # (B, T, V): logits[:, t] predicts token t + 1
    values: torch.Tensor  # (B, T): V of the state after reading tokens[: t + 1]


class AgentModel(nn.Module):
    """A causal LM policy with a value head on its last hidden state, or (``value_head`` a
    :class:`CriticModel`) a critic with a transformer of its own."""

    def __init__(self, policy: nn.Module, tokenizer) -> None:
        super().__init__()
        self.policy = policy
        self.tokenizer = tokenizer
        self.value_head = ValueHead(policy.config.hidden_size)
        # values are the head's output times this (a trainer's algo.value_scale): a head that
        # starts at 0 reaches returns of ~10 in a tenth of the steps when it predicts R / 10
        self.value_scale = 1.0

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        with_values: bool = True,
        value_grad_to_policy: bool = True,
    ) -> AgentOutput:
        """Logits and values; with ``value_grad_to_policy=False`` the value loss trains the
        value head alone (its input, the last hidden state, is detached). A separate critic
        never reaches the policy."""
        separate = isinstance(self.value_head, CriticModel)
        out = self.policy(
            input_ids=input_ids,
            attention_mask=causal_only(attention_mask),
            output_hidden_states=with_values and not separate,
            use_cache=False,
        )
        if with_values and separate:
            values = self.value_head(input_ids, attention_mask) * self.value_scale
            return AgentOutput(out.logits, values)
        hidden = out.hidden_states[-1] if with_values else None
        if hidden is not None and not value_grad_to_policy:
            hidden = hidden.detach()
        values = (
            self.value_head(hidden) * self.value_scale
            if hidden is not None
            else out.logits.new_zeros(out.logits.shape[:2])
        )
        return AgentOutput(out.logits, values)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


def build_agent(
    size: str = "tiny",
    arch: str = "llama",
    tokenizer=None,
    max_positions: int = 2048,
    seed: int = 0,
    grid: bool = False,
) -> AgentModel:
    """A randomly initialised agent of a named size (``tiny``, ``small``, ``base``); with
    ``grid`` (llama only) observation tokens also get row / column embeddings
    (:mod:`tokenergy.models.grid`)."""
    from transformers import AutoModelForCausalLM

    import tokenergy.models.grid  # noqa: F401  (registers the grid model with the Auto classes)

    tokenizer = tokenizer or build_tokenizer()
    cfg = _config(arch, size, len(tokenizer), tokenizer, max_positions, grid)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = AutoModelForCausalLM.from_config(cfg)
        agent = AgentModel(policy, tokenizer)
    return agent


def separate_critic(agent: AgentModel) -> AgentModel:
    """Give ``agent`` a critic with its own transformer: a copy of the policy's (LoRA merged,
    every weight trainable) under the current value head, so the values start where
    they were. A no-op when the critic is already separate."""
    import copy

    if isinstance(agent.value_head, CriticModel):
        return agent
    src = copy.deepcopy(agent.policy)
    if hasattr(src, "merge_and_unload"):
        src = src.merge_and_unload()
    trunk = src.base_model
    trunk.requires_grad_(True)
    agent.value_head = CriticModel(trunk, agent.value_head)
    return agent


def _quiet_transformers() -> None:
    """No per-shard progress bars from ``transformers`` inside our own progress display."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def freeze_lower_blocks(policy: torch.nn.Module, k: int) -> list[str]:
    """Freeze all but the top ``k`` transformer blocks of ``policy``; return the frozen names.

    The input embeddings freeze with the lower blocks, unless they are tied to the LM head
    (then they are the output layer and keep training); the final norm and the LM head keep
    training. Works on Llama-style (``model.layers``) and GPT-2-style (``transformer.h``)
    models and on peft wrappers around them.
    """
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    inner = getattr(base, "model", None) or getattr(base, "transformer", None)
    blocks = getattr(inner, "layers", None)
    if blocks is None:
        blocks = getattr(inner, "h", None)
    if blocks is None:
        raise ValueError(
            f"train_top_blocks: cannot find the transformer blocks of {type(base).__name__}"
        )
    if k > len(blocks):
        raise ValueError(f"train_top_blocks = {k}, but the model has {len(blocks)} blocks")
    frozen: list[torch.nn.Module] = list(blocks)[: len(blocks) - k]
    emb = base.get_input_embeddings()
    out = base.get_output_embeddings()
    if out is None or out.weight is not emb.weight:
        frozen.append(emb)
    if hasattr(inner, "wpe"):
        frozen.append(inner.wpe)  # GPT-2's learned positions sit below the blocks too
    if hasattr(inner, "grid"):
        frozen.append(inner.grid)  # so do the grid model's row / column embeddings
    frozen_ids = {id(p) for m in frozen for p in m.parameters()}
    names = []
    for name, p in policy.named_parameters():
        if id(p) in frozen_ids:
            p.requires_grad_(False)
            names.append(name)
    return names


def agent_from_config(model_cfg, seed: int = 0) -> AgentModel:
    """The agent a run's ``model`` section asks for: a local folder, a registered pretrained
    model, or a fresh one of a named size; then LoRA when ``lora_r > 0``."""
    from tokenergy.models.pretrained import PRETRAINED, add_tag_tokens, apply_lora

    if model_cfg.path:
        agent = load_agent(model_cfg.path)
    elif model_cfg.pretrained:
        agent = load_agent(PRETRAINED.get(model_cfg.pretrained)())
    else:
        agent = build_agent(model_cfg.size, model_cfg.arch, seed=seed, grid=model_cfg.grid)
    if isinstance(agent.value_head, CriticModel) and model_cfg.critic == "shared":
        # the config decides: a folder saved with a separate critic (a PPO run's agent) starts
        # a shared-critic run (GRPO, say) without the critic's transformer, its head kept
        agent.value_head = agent.value_head.head
    new_ids = add_tag_tokens(agent)
    if model_cfg.lora_r > 0:
        apply_lora(
            agent, model_cfg.lora_r, model_cfg.lora_alpha, list(model_cfg.lora_targets), new_ids
        )
    return agent


def save_agent(agent: AgentModel, folder: str | Path) -> Path:
    """Write ``policy/`` (model + tokenizer) and ``value_head.safetensors`` under ``folder``,
    and ``critic/`` when the critic is separate.

    A LoRA policy is saved merged (a plain causal LM), so the folder loads without ``peft``.
    """
    _quiet_transformers()
    folder = Path(folder)
    (folder / "policy").mkdir(parents=True, exist_ok=True)
    policy = agent.policy
    if hasattr(policy, "merge_and_unload"):
        import copy

        policy = copy.deepcopy(policy).merge_and_unload()
    policy.save_pretrained(folder / "policy")
    agent.tokenizer.save_pretrained(folder / "policy")
    head = agent.value_head
    if isinstance(head, CriticModel):
        head.trunk.save_pretrained(folder / "critic")
        head = head.head
    elif (folder / "critic").is_dir():  # a critic saved here before is not this agent's
        import shutil

        shutil.rmtree(folder / "critic")
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(folder / "value_head.safetensors"))
    return folder


def load_agent(folder: str | Path, dtype: torch.dtype = torch.float32) -> AgentModel:
    """Load an agent saved by :func:`save_agent`, or any local Hugging Face causal-LM folder.

    Raises:
        ModelLoadError: the folder is missing, has no ``config.json`` of a causal LM, or no
            tokenizer — the message names the path.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import tokenergy.models.grid  # noqa: F401  (registers the grid model with the Auto classes)

    _quiet_transformers()
    folder = Path(folder)
    policy_dir = folder / "policy" if (folder / "policy" / "config.json").is_file() else folder
    if not (policy_dir / "config.json").is_file():
        raise ModelLoadError(f"model folder {str(folder)!r} has no config.json: not a model folder")
    try:
        arch = json.loads((policy_dir / "config.json").read_text()).get("architectures") or []
    except json.JSONDecodeError as err:
        raise ModelLoadError(
            f"{str(policy_dir / 'config.json')!r} is not valid JSON: {err}"
        ) from None
    if arch and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in arch):
        raise ModelLoadError(
            f"model folder {str(policy_dir)!r} holds a {arch[0]}, not a causal language model"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(policy_dir)
        policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=dtype)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load a causal LM from {str(policy_dir)!r}: {err}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    agent = AgentModel(policy, tokenizer)
    head = folder / "value_head.safetensors"
    if head.is_file():
        agent.value_head.load_state_dict(load_file(str(head)))
    if (folder / "critic" / "config.json").is_file():
        from transformers import AutoModel

        try:
            trunk = AutoModel.from_pretrained(folder / "critic", dtype=dtype)
        except (OSError, ValueError) as err:
            raise ModelLoadError(
                f"cannot load the critic from {str(folder / 'critic')!r}: {err}"
            ) from None
        agent.value_head = CriticModel(trunk, agent.value_head)
    return agent.to(dtype)

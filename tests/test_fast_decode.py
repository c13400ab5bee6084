"""The lean Llama decode loop gives the Hugging Face forward's logits and the same tokens."""

import pytest
import torch

from tokenergy.models import build_agent
from tokenergy.models.fast_decode import LlamaDecoder, decoder_for
from tokenergy.rollout import generate_turns


def _left_padded(pad: int):
    ids = torch.tensor([[pad] * 3 + list(range(10, 17)), list(range(20, 30))])
    mask = (ids != pad).long()
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _check_against_full_forward(policy, pad: int) -> None:
    ids, mask, pos = _left_padded(pad)
    with torch.no_grad():
        full = policy(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    dec = LlamaDecoder(policy)
    got = dec.forward(ids[:, :6], mask[:, :6], pos[:, :6], capacity=10)  # prompt of 6
    torch.testing.assert_close(got, full[:, 5], atol=2e-5, rtol=1e-4)
    for j in range(6, 10):  # then one token at a time from the cache
        got = dec.forward(ids[:, j : j + 1], mask[:, j : j + 1], pos[:, j : j + 1])
        torch.testing.assert_close(got, full[:, j], atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="holds 10 positions"):
        dec.forward(ids[:, :1], mask[:, :1], pos[:, :1])


def test_logits_equal_the_full_forward_with_left_padding():
    agent = build_agent("tiny", seed=0).eval()
    _check_against_full_forward(agent.policy, agent.tokenizer.pad_token_id)


def test_grouped_query_attention_and_lora_adapters():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=48, rope_theta=100.0, pad_token_id=0,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, lora).eval()  # random adapters: they change the logits
    assert decoder_for(peft_model) is not None
    _check_against_full_forward(peft_model, pad=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_is_unchanged(monkeypatch, temperature):
    agent = build_agent("tiny", seed=1).eval()
    tok = agent.tokenizer
    contexts = [[tok.bos_token_id, *range(10, 10 + n)] for n in (4, 15, 9)]

    def run():
        g = torch.Generator().manual_seed(3)
        return generate_turns(agent.policy, contexts, {7, 11}, tok.pad_token_id, 24, temperature, 1.0, g)  # fmt: skip

    fast = run()
    monkeypatch.setenv("TOKENERGY_FAST_DECODE", "0")
    assert decoder_for(agent.policy) is None
    assert run() == fast
    assert all(1 <= len(x) <= 24 for x in fast)


def test_other_architectures_and_training_mode_fall_back():
    assert decoder_for(build_agent("tiny", arch="gpt2", seed=0).policy.eval()) is None
    assert decoder_for(build_agent("tiny", seed=0).policy.train()) is None

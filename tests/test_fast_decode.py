"""The lean Llama decode engine gives the Hugging Face forward's logits and the same tokens."""

import pytest
import torch

from tokenergy.models import build_agent
from tokenergy.models.fast_decode import LlamaDecoder, decoder_for
from tokenergy.rollout import generate_turns


def _full_logits(policy, seq: list[int]) -> torch.Tensor:
    """The Hugging Face forward over one whole sequence, no cache, no padding: ``(T, V)``."""
    with torch.no_grad():
        return policy(input_ids=torch.tensor([seq])).logits[0]


def _check_against_full_forward(policy) -> None:
    """Ragged chunks, single steps with a row that does not advance, a dropped row and a
    second chunk: every logit the decoder returns is the full forward's at that position."""
    seqs = [list(range(10, 24)), list(range(30, 34)), list(range(40, 49))]
    full = [_full_logits(policy, s) for s in seqs]
    dec = LlamaDecoder(policy)
    dec.start(3)
    got = dec.append(
        [seqs[0][:5], seqs[1][:2], seqs[2][:7]]
    )  # a different number of tokens per row
    for i, n in enumerate((5, 2, 7)):
        torch.testing.assert_close(got[i], full[i][n - 1], atol=2e-5, rtol=1e-4)
    # one token per row; row 1 is finished: it computes but keeps its length
    got = dec.step(torch.tensor([seqs[0][5], 5, seqs[2][7]]), torch.tensor([True, False, True]))
    assert dec.lengths.tolist() == [6, 2, 8]
    torch.testing.assert_close(got[0], full[0][5], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got[2], full[2][7], atol=2e-5, rtol=1e-4)
    dec.keep([2, 0])  # row 1 leaves, the others swap places
    got = dec.append([seqs[2][8:9], seqs[0][6:]])  # the rest of each sequence
    torch.testing.assert_close(got[0], full[2][8], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got[1], full[0][-1], atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="at least one new token"):
        dec.append([[1], []])
    with pytest.raises(ValueError, match="2 rows"):
        dec.append([[1]])


def test_logits_equal_the_full_forward_over_ragged_rows():
    agent = build_agent("tiny", seed=0).eval()
    _check_against_full_forward(agent.policy)


def test_grid_model_logits_equal_the_full_forward_across_turns():
    """A grid model's coordinates carried token by token equal those of the whole sequence:
    the decoder's logits over a played two-turn episode are the full forward's, position by
    position, whether the context arrives in one chunk or turn by turn."""
    from tokenergy.envs import make
    from tokenergy.rollout import rollout

    agent = build_agent("tiny", seed=2, grid=True).eval()
    tok = agent.tokenizer
    envs = [make("sokoban", size=6, num_boxes=1, max_steps=10) for _ in range(2)]
    eps = rollout(agent.policy, tok, envs, [3, 4], max_turns=2, turn_fn=lambda e: e.solver_turn())
    seqs = [e.tokens for e in eps]
    full = [_full_logits(agent.policy, s) for s in seqs]
    dec = LlamaDecoder(agent.policy)
    dec.start(2)
    cut = [len(s) // 3 for s in seqs]
    got = dec.append([s[:c] for s, c in zip(seqs, cut, strict=True)])
    for i, c in enumerate(cut):
        torch.testing.assert_close(got[i], full[i][c - 1], atol=2e-5, rtol=1e-4)
    # then one token per step; a row that reached its last token waits (does not advance)
    while bool((dec.lengths < torch.tensor([len(s) - 1 for s in seqs])).any()):
        pos = dec.lengths.tolist()
        advance = torch.tensor([p < len(s) - 1 for p, s in zip(pos, seqs, strict=True)])
        got = dec.step(
            torch.tensor([s[min(p, len(s) - 1)] for p, s in zip(pos, seqs, strict=True)]), advance
        )
        for i, p in enumerate(pos):
            if advance[i]:
                torch.testing.assert_close(got[i], full[i][p], atol=2e-5, rtol=1e-4)
    got = dec.append([s[-1:] for s in seqs])  # the last tokens as a chunk of one
    for i in range(2):
        torch.testing.assert_close(got[i], full[i][-1], atol=2e-5, rtol=1e-4)


def test_cache_grows_past_its_first_block():
    agent = build_agent("tiny", seed=0).eval()
    seq = [
        int(x) for x in torch.randint(10, 60, (300,), generator=torch.Generator().manual_seed(0))
    ]
    full = _full_logits(agent.policy, seq)
    dec = LlamaDecoder(agent.policy)
    dec.start(1)
    dec.append([seq[:100]])
    got = dec.append([seq[100:]])  # 300 slots: more than the first block
    assert dec.capacity >= 300
    torch.testing.assert_close(got[0], full[-1], atol=2e-5, rtol=1e-4)


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
    _check_against_full_forward(peft_model)


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


def _uneven_envs():
    """FrozenLake envs whose episodes end after 1, 3, 2 and 4 turns (a turn costs a step):
    rows leave the batch at different turns."""
    from tokenergy.envs import make

    return [make("frozenlake", max_steps=n) for n in (1, 3, 2, 4)]


@pytest.mark.parametrize("grid", [False, True])
def test_rollout_tokens_equal_the_uncached_path(monkeypatch, grid):
    """Sampled multi-turn rollouts, rows leaving the batch as their episodes end: the engine
    that keeps each episode's cache across turns writes the same tokens as prefilling the
    whole context every turn through the Hugging Face forward, from the same generator."""
    from tokenergy.rollout import rollout

    agent = build_agent("tiny", seed=3, grid=grid).eval()

    def run():
        eps = rollout(agent.policy, agent.tokenizer, _uneven_envs(), [5, 6, 7, 8], max_turns=4,
                      max_turn_tokens=12, generator=torch.Generator().manual_seed(11))  # fmt: skip
        return [e.tokens for e in eps], [e.turns for e in eps]

    fast = run()
    assert fast[1] == [1, 3, 2, 4]
    monkeypatch.setenv("TOKENERGY_FAST_DECODE", "0")
    assert run() == fast


def test_rows_that_leave_do_not_change_the_others():
    """Greedy: each episode played in a batch whose rows finish at different turns (their
    cache slots dropped, the batch compacted) equals the episode played alone."""
    from tokenergy.rollout import rollout

    agent = build_agent("tiny", seed=4, grid=True).eval()
    kw = dict(max_turns=4, max_turn_tokens=12, temperature=0.0)
    together = rollout(agent.policy, agent.tokenizer, _uneven_envs(), [1, 2, 3, 4], **kw)
    for i, env in enumerate(_uneven_envs()):
        alone = rollout(agent.policy, agent.tokenizer, [env], [i + 1], **kw)[0]
        assert alone.tokens == together[i].tokens

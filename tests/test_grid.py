"""Row / column embeddings for grid observations: coordinates by hand, the same logits from a
whole-sequence forward, the lean decoder and the Hugging Face cache, save / load, training."""

import pytest
import torch

from tokenergy.envs import make
from tokenergy.models import build_agent, build_tokenizer, load_agent, save_agent
from tokenergy.models.fast_decode import LlamaDecoder, decoder_for
from tokenergy.models.grid import GridLlamaForCausalLM, grid_coordinates
from tokenergy.rollout import generate_turns, rollout

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_coordinates_by_hand():
    # ids: 1 <bos>, 9 newline, 5 <think>, 6 <answer>, 7 </answer>, others are words
    B, NL, TH, AN, EA = 1, 9, 5, 6, 7
    ids = torch.tensor([[0, B, 20, 21, NL, 22, 23, TH, 30, AN, 31, EA, 24, NL, 25, TH, 32]])
    rows, cols = grid_coordinates(ids, NL, [B, EA], [TH, AN], [0, B, TH, AN, EA], 8, 8)
    # first observation: two rows of two; the agent's turn gets 0; after </answer> a new
    # observation starts at row 1; its newline and the tags get 0
    assert rows.tolist() == [[0, 0, 1, 1, 0, 2, 2, 0, 0, 0, 0, 0, 1, 0, 2, 0, 0]]
    assert cols.tolist() == [[0, 0, 1, 2, 0, 1, 2, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0]]
    # clamped to the table
    rows, cols = grid_coordinates(ids, NL, [B, EA], [TH, AN], [0, B, TH, AN, EA], 1, 1)
    assert rows.max() == 1 and cols.max() == 1


def test_sokoban_room_coordinates_are_its_rows_and_columns(tok):
    env = make("sokoban", level=["#####", "#P_O#", "#_X_#", "#####"])
    obs, _ = env.reset()
    ids = torch.tensor([[tok.bos_token_id, *tok(obs, add_special_tokens=False).input_ids]])
    agent = build_agent("tiny", tokenizer=tok, grid=True)
    rows, cols = agent.policy.model.grid.coordinates(ids)
    p = (ids[0] == tok.convert_tokens_to_ids("P")).nonzero().item()
    x = (ids[0] == tok.convert_tokens_to_ids("X")).nonzero().item()
    assert (rows[0, p].item(), cols[0, p].item()) == (2, 2)  # one-based: row 1, col 1
    assert (rows[0, x].item(), cols[0, x].item()) == (3, 3)


def _episode_ids(tok, agent):
    env = make("sokoban", max_actions_per_turn=2, plan_in_reasoning=False)
    (ep,) = rollout(agent.policy, tok, [env], [3], max_turns=3, turn_fn=lambda e: e.solver_turn())
    return torch.tensor([ep.tokens])


def test_incremental_decoding_equals_the_whole_forward(tok):
    agent = build_agent("tiny", tokenizer=tok, grid=True, seed=2)
    policy = agent.policy.eval()
    with torch.no_grad():  # the row / column tables start random, so they matter
        for emb in (policy.model.grid.row_embed, policy.model.grid.col_embed):
            emb.weight[1:].normal_()
    ids = _episode_ids(tok, agent)
    T = ids.shape[1]
    with torch.no_grad():
        full = policy(input_ids=ids).logits[0]
    assert isinstance(policy, GridLlamaForCausalLM)
    dec = LlamaDecoder(policy)  # carries each token's row and column along by itself
    dec.start(1)
    k = 20
    got = dec.append([ids[0, :k].tolist()])
    torch.testing.assert_close(got[0], full[k - 1], atol=2e-5, rtol=1e-4)
    for j in range(k, T):
        got = dec.step(ids[:, j], torch.tensor([True]))
        torch.testing.assert_close(got[0], full[j], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_is_the_same_with_and_without_the_lean_decoder(tok, monkeypatch, temperature):
    agent = build_agent("tiny", tokenizer=tok, grid=True, seed=4)
    policy = agent.policy.eval()
    with torch.no_grad():
        policy.model.grid.row_embed.weight[1:].normal_()
    ids = _episode_ids(tok, agent)[0].tolist()
    contexts = [ids[:30], ids[:55], ids[:41]]

    def run():
        g = torch.Generator().manual_seed(1)
        return generate_turns(policy, contexts, {7}, tok.pad_token_id, 16, temperature, 1.0, g)

    assert decoder_for(policy) is not None
    fast = run()
    monkeypatch.setenv("TOKENERGY_FAST_DECODE", "0")
    assert run() == fast


def test_save_load_and_the_grid_tables_train(tmp_path, tok):
    agent = build_agent("tiny", tokenizer=tok, grid=True, seed=0)
    ids = _episode_ids(tok, agent)
    opt = torch.optim.Adam(agent.policy.parameters(), lr=1e-2)
    loss = agent.policy(input_ids=ids, labels=ids).loss
    loss.backward()
    grid = agent.policy.model.grid
    assert grid.row_embed.weight.grad[1:].abs().sum() > 0
    assert grid.row_embed.weight.grad[0].abs().sum() == 0  # "not a grid token" never trains
    opt.step()
    save_agent(agent, tmp_path / "a")
    back = load_agent(tmp_path / "a")
    assert type(back.policy).__name__ == "GridLlamaForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(
            back.policy(input_ids=ids).logits, agent.policy(input_ids=ids).logits
        )


def test_grid_is_for_llama_only():
    with pytest.raises(ValueError, match="llama"):
        build_agent("tiny", arch="gpt2", grid=True)

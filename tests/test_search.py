"""Inference-time search: MCTS on hand-worked and stored golden trees, beam width 1 against
greedy decoding, best-of-n, and no illegal move ever."""

import math

import numpy as np
import pytest
import torch

from tokenergy.envs import make
from tokenergy.search import (
    LMSearchModel,
    Proposal,
    SearchState,
    beam,
    best_of_n,
    mcts,
    play,
)


class UniformTree:
    """A search model over tree_search: uniform priors, value 0 (no LM)."""

    def __init__(self):
        self.proposals = 0

    def root(self, env, seed):
        env = env.clone()
        env.reset(seed=seed)
        return SearchState(env, [])

    def propose(self, state):
        self.proposals += 1
        actions = state.env.legal_actions()
        return Proposal([], actions, [math.log(1 / len(actions))] * len(actions), 0.0)

    def step(self, state, action, proposal):
        env = state.env.clone()
        _, r, term, trunc, info = env.step(f"<answer> {action} </answer>")
        done = term or trunc
        return SearchState(env, [], done, bool(info.get("success")), state.ret + r), r


def _tree_state(k, depth, goal):
    env = make("tree_search", k=k, depth=depth)
    env.reset(options={"goal": goal})
    return SearchState(env, [])


def test_mcts_hand_worked_tree():
    # k = 2, depth 1, goal under child 2, c_puct = 1, uniform priors, value 0:
    # sim 1 expands the root; sim 2 ties (U = 0.5 each) and takes child 1: FAIL, reward 0;
    # sim 3: child 2 has U = 0.5 * sqrt(2) > child 1's 0.5 * sqrt(2) / 2: goal, reward 1;
    # sim 4: child 2 scores 1 + 0.43 against child 1's 0 + 0.43: goal again.
    res = mcts(UniformTree(), _tree_state(2, 1, (1,)), simulations=4, c_puct=1.0)
    assert res.visits == {"1": 1, "2": 2}
    assert res.action == "2"
    assert res.root.n == 4
    child2 = res.root.children[1]
    assert child2.q == 1.0 and child2.state.done and child2.state.success


# Stored golden visit counts (k = 2, depth 2, goal (1, 0), c_puct 1.5, 24 simulations). A change
# in selection, expansion or backup shows here first.
GOLDEN = {"1": 3, "2": 20}


def test_mcts_golden_tree():
    model = UniformTree()
    res = mcts(model, _tree_state(2, 2, (1, 0)), simulations=24, c_puct=1.5)
    assert res.visits == GOLDEN
    assert res.action == "2"
    assert sum(res.visits.values()) == 23  # the first simulation expands the root
    assert model.proposals <= 24


def test_mcts_noise_and_errors():
    s = _tree_state(3, 1, (2,))
    a = mcts(UniformTree(), s, 30, dirichlet_alpha=0.3, rng=np.random.default_rng(0))
    b = mcts(UniformTree(), s, 30, dirichlet_alpha=0.3, rng=np.random.default_rng(0))
    assert a.visits == b.visits and a.action == "3"
    with pytest.raises(ValueError, match="simulations"):
        mcts(UniformTree(), s, 0)
    done = SearchState(s.env, [], done=True)
    with pytest.raises(ValueError, match="terminal"):
        mcts(UniformTree(), done, 4)


def test_mcts_finds_every_goal_and_never_plays_an_illegal_move():
    for goal in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        model = UniformTree()
        state = _tree_state(2, 2, goal)
        while not state.done:
            res = mcts(model, state, simulations=32)
            assert res.action in state.env.legal_actions()
            state, _ = model.step(state, res.action, None)
        assert state.success and len(state.env.visited) <= 4


def test_beam_searches_the_tree():
    model = UniformTree()
    state, turns, _ = beam(model, _tree_state(2, 2, (1, 1)), width=4, depth=2, c_value=1.0)
    assert state.success and turns == ["2", "2"]  # width 4 holds all four paths of length 2
    with pytest.raises(ValueError, match="width"):
        beam(model, _tree_state(2, 2, (1, 1)), width=0)


# --------------------------------------------------------------------------- with an LM agent


# One small slippery map: a short SFT gives a fluent agent, and seeds still differ.
KW = {"desc": ["SFF", "FHF", "FFG"], "is_slippery": True}


@pytest.fixture(scope="module")
def sft_agent():
    from tokenergy.algos.lm import sft
    from tokenergy.config import config_from_dict
    from tokenergy.models import build_agent

    torch.manual_seed(0)
    cfg = config_from_dict(
        {
            "kind": "lm",
            "env": {"name": "frozenlake", "max_turns": 6, "kwargs": KW},
            "model": {"size": "tiny"},
            "sft": {"episodes": 96, "epochs": 12, "batch_size": 16, "lr": 1e-2, "epsilon": 0.2},
            "rollout": {"episodes": 4, "max_turn_tokens": 40},
            "algo": {"iterations": 0, "minibatches": 1},
            "log": {"tensorboard": False, "progress": False},
        }
    )
    agent = build_agent("tiny", seed=0)
    sft(agent, cfg)
    return agent.eval()


def test_beam_width_one_without_value_equals_greedy_decoding(sft_agent):
    """Along greedy decoding's own episodes, every turn whose answer is a legal move is the
    move beam search of width 1 (c_value = 0) picks, after the same reasoning."""
    from tokenergy.rollout import encode_observation, rollout

    tok = sft_agent.tokenizer
    model = LMSearchModel(sft_agent, max_turn_tokens=40)

    def advance(state, text):  # play greedy's own turn text, to stay on its trajectory
        env = state.env.clone()
        obs, r, term, trunc, _ = env.step(text)
        ids = tok(text, add_special_tokens=False).input_ids + encode_observation(tok, obs)
        return SearchState(env, state.context + ids, term or trunc, False, state.ret + r)

    compared = 0
    for seed in range(4):
        greedy = rollout(sft_agent.policy, tok, [make("frozenlake", **KW)], [seed],
                         max_turns=6, max_turn_tokens=40, temperature=0.0)[0]  # fmt: skip
        state = model.root(make("frozenlake", **KW), seed)
        for text in greedy.turn_texts:
            ids = tok(text, add_special_tokens=False).input_ids
            answer = text.split("<answer>", 1)[-1]
            move = answer.split("</answer>")[0].strip()
            well_formed = text.count("<answer>") == 1 and answer.strip().endswith("</answer>")
            if well_formed and move in state.env.legal_actions():
                prop = model.propose(state)
                assert ids[: len(prop.reasoning)] == prop.reasoning  # the same greedy reasoning
                _, turns, _ = beam(model, state, width=1, depth=1, c_value=0.0)
                assert turns == [move]
                compared += 1
            state = advance(state, text)
    assert compared >= 4


def test_lm_mcts_and_best_of_n_return_legal_moves(sft_agent):
    model = LMSearchModel(sft_agent, max_turn_tokens=40)
    env = make("frozenlake")

    def choose(state):
        res = mcts(model, state, simulations=6)
        assert res.action in state.env.legal_actions()
        return res.action, res.root.proposal, res.generated

    root = model.root(env, 3)
    state, generated = play(model, env, 3, choose, max_turns=4)
    assert generated > 0
    assert state.env.steps == 4 or state.done  # every turn played a move (all legal)
    assert len(state.context) > len(root.context)
    best, scores, tokens = best_of_n(sft_agent, env, 3, n=4, max_turns=6,
                                     generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert best.episode_return == max(scores) and len(scores) == 4 and tokens > 0

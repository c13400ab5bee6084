"""The verl plug-in: a text env played through a generate server gives verl the tokens, masks,
turns and reward of our own rollout of the same env and seed; inside a verl environment
(``make verl``), the agent loop is registered and returns that episode as an AgentLoopOutput."""

import asyncio
import importlib.util

import pytest

from tokenergy.envs import make
from tokenergy.integrations.verl import AGENT_NAME, play_episode
from tokenergy.models import build_tokenizer
from tokenergy.rollout import rollout
from tokenergy.rollout.episodes import noisy_solver
from tokenergy.types import Role

HAS_VERL = importlib.util.find_spec("verl") is not None


def replaying(tok, texts, calls=None):
    """A generate server that writes the given turns in order."""
    turns = iter(texts)

    async def generate(prompt_ids, params):
        if calls is not None:
            calls.append((list(prompt_ids), dict(params)))
        return tok(next(turns), add_special_tokens=False).input_ids, None

    return generate


def ours(tok, env_name, seed, epsilon, max_turns, **env_kwargs):
    import numpy as np

    (ep,) = rollout(
        None, tok, [make(env_name, **env_kwargs)], [seed], max_turns=max_turns,
        max_turn_tokens=64, max_tokens=4096,
        turn_fn=noisy_solver(epsilon, np.random.default_rng(seed)),
    )  # fmt: skip
    return ep


@pytest.mark.parametrize(
    ("env_name", "seed", "epsilon"),
    [("sokoban", 3, 0.0), ("sokoban", 4, 0.5), ("frozenlake", 1, 0.5), ("sudoku4", 2, 0.3)],
)
def test_an_episode_through_a_generate_server_is_our_rollout_of_it(env_name, seed, epsilon):
    tok = build_tokenizer()
    want = ours(tok, env_name, seed, epsilon, max_turns=5)
    calls = []
    got = asyncio.run(
        play_episode(replaying(tok, want.turn_texts, calls), tok, env_name, seed,
                     {"temperature": 1.0}, max_turns=5)
    )  # fmt: skip
    n = len(got.prompt_ids)
    sequence = got.prompt_ids + got.response_ids
    # ours keeps the observation after the last turn (to bootstrap a value); verl needs none
    assert want.tokens[: len(sequence)] == sequence
    assert want.roles[n : len(sequence)] == [
        int(Role.OBSERVATION) if m == 0 else r
        for m, r in zip(got.response_mask, want.roles[n : len(sequence)], strict=True)
    ]
    assert [int(r != int(Role.OBSERVATION)) for r in want.roles[n : len(sequence)]] == (
        got.response_mask
    )
    assert got.reward == pytest.approx(want.episode_return)
    assert (got.turns, got.success) == (want.turns, want.success)
    # every turn asks the server to stop at the end of the answer, and sees the whole context
    assert all(p["stop"] == ["</answer>"] and p["temperature"] == 1.0 for _, p in calls)
    assert [len(c) for c, _ in calls] == sorted(len(c) for c, _ in calls)


def test_the_response_stops_at_its_length():
    tok = build_tokenizer()
    want = ours(tok, "sokoban", 3, 0.5, max_turns=5)
    got = asyncio.run(
        play_episode(replaying(tok, want.turn_texts), tok, "sokoban", 3, {}, max_turns=5,
                     response_length=40)
    )  # fmt: skip
    assert len(got.response_ids) == len(got.response_mask) <= 40
    assert got.truncated or got.turns == want.turns


@pytest.mark.skipif(not HAS_VERL, reason="verl is not installed (make verl)")
def test_the_agent_loop_is_registered_and_returns_the_episode():
    from types import SimpleNamespace

    from hydra.utils import get_class
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    import tokenergy.integrations.verl as plug

    # verl builds the loop from this path (hydra.utils.instantiate)
    assert get_class(_agent_loop_registry[AGENT_NAME]["_target_"]) is plug.TokenergyTextEnvLoop
    tok = build_tokenizer()
    want = ours(tok, "sokoban", 4, 0.5, max_turns=5)
    texts = iter(want.turn_texts)

    class Server:
        async def generate(self, request_id, prompt_ids, sampling_params, **kw):
            ids = tok(next(texts), add_special_tokens=False).input_ids
            # what verl's TokenOutput carries (its module needs the serving stack)
            return SimpleNamespace(token_ids=ids, log_probs=[-0.5] * len(ids))

    loop = object.__new__(plug.TokenergyTextEnvLoop)
    loop.server_manager, loop.tokenizer = Server(), tok
    loop.rollout_config = SimpleNamespace(response_length=1024)
    out = asyncio.run(
        loop.run({"temperature": 1.0}, extra_info={"env": "sokoban", "seed": 4, "max_turns": 5},
                 raw_prompt=[])
    )  # fmt: skip
    assert (
        out.prompt_ids + out.response_ids
        == want.tokens[: len(out.prompt_ids) + len(out.response_ids)]
    )
    assert out.reward_score == pytest.approx(want.episode_return)
    assert out.num_turns == 2 * want.turns
    assert [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m] == (
        [-0.5] * sum(out.response_mask)
    )
    assert all(
        lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if not m
    )


@pytest.mark.skipif(not HAS_VERL, reason="verl is not installed (make verl)")
def test_a_fresh_process_that_imports_verl_has_the_loop():
    """What a Ray worker does: import verl, which loads the verl.plugins entry points."""
    import subprocess
    import sys

    code = (
        "import verl\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as r\n"
        f"print({AGENT_NAME!r} in r)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.stdout.strip() == "True", out.stderr[-2000:]

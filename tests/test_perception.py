"""Perception: what an agent's scratchpad says it sees, scored against the env's true state;
and the ActFocus paper's env forms (coordinates observation, up to two moves a turn, the
strict think/answer format, a scratchpad that states without planning)."""

import re

import numpy as np
import pytest
import torch

from tokenergy.envs import make
from tokenergy.envs.text import format_turn, state_match, stated_state
from tokenergy.models import build_agent, build_tokenizer
from tokenergy.rollout import collate, rollout
from tokenergy.rollout.episodes import episode_stats

torch.set_num_threads(1)

# every env that describes its state, in each scratchpad form
DESCRIBED = [
    ("sokoban", {}),
    ("sokoban", {"plan_in_reasoning": False, "max_actions_per_turn": 2}),
    ("frozenlake", {"is_slippery": True}),
    ("frozenlake", {"observation": "coords", "plan_in_reasoning": False, "is_slippery": True}),
    ("sudoku4", {}),
    ("sudoku4", {"observation": "candidates", "plan_in_reasoning": False}),
    ("treasure", {}),
]


def test_stated_state_cuts_the_think_span_before_the_plan():
    turn = "<think> player row 2 col 3 . plan : Up Left </think> <answer> Up </answer>"
    assert stated_state(turn, "plan :") == ["player", "row", "2", "col", "3"]
    assert stated_state(turn, None) == [
        "player",
        "row",
        "2",
        "col",
        "3",
        ".",
        "plan",
        ":",
        "Up",
        "Left",
    ]
    # an unclosed scratchpad ends at the answer, or at the end of the text
    assert stated_state("<think> a b <answer> Up </answer>", None) == ["a", "b"]
    assert stated_state("<think> a b", "plan :") == ["a", "b"]
    assert stated_state("<answer> Up </answer>", None) == []  # no scratchpad, nothing stated
    assert stated_state(None, None) == []


def test_state_match_by_hand():
    truth = ["player", "row", "2", "col", "3", ".", "box", "row", "3", "col", "3"]
    assert state_match(truth, truth) == (True, 1.0)
    said = ["player", "row", "2", "col", "4", ".", "box", "row", "3", "col", "3"]
    assert state_match(said, truth) == (False, pytest.approx(10 / 11))
    # a missing word shifts nothing before it, and counts against the longer length
    assert state_match(truth[:5], truth) == (False, pytest.approx(5 / 11))
    assert state_match([*truth, "extra"], truth) == (False, pytest.approx(11 / 12))
    assert state_match([], []) == (True, 1.0)


def test_sokoban_perception_of_another_room_by_hand():
    a = make("sokoban", level=["######", "#P___#", "#_X__#", "#___O#", "######"])
    b = make("sokoban", level=["######", "#____#", "#_P_X#", "#__O_#", "######"])
    a.reset()
    b.reset()
    assert a.state_text() == "player row 1 col 1 . box row 2 col 2 . target row 3 col 4"
    assert b.state_text() == "player row 2 col 2 . box row 2 col 4 . target row 3 col 3"
    # b's description in a's room: the 11 fixed words, the box's row 2 and the target's
    # row 3 agree
    exact, share = a.perceive(format_turn(b.state_text(), ["Up"]))
    assert not exact and share == pytest.approx(13 / 17)
    assert a.perceive(format_turn(a.reasoning(), ["Up"])) == (True, 1.0)


@pytest.mark.parametrize(("name", "kwargs"), DESCRIBED)
def test_solver_turns_state_the_truth_at_every_turn(name, kwargs):
    for seed in range(5):
        env = make(name, **kwargs)
        env.reset(seed=seed)
        for _ in range(env.max_steps):
            assert env.perceive(env.solver_turn()) == (True, 1.0)
            *_, term, trunc, _ = env.step(env.solver_turn())
            if term or trunc:
                break


@pytest.mark.parametrize(("name", "kwargs"), DESCRIBED)
def test_perception_of_another_state_is_chance(name, kwargs):
    """A description copied from another level is exactly right only when the two states
    coincide, and word by word it scores what the two descriptions share by chance."""
    said, truth = [], []
    for seed in range(40):
        here, there = make(name, **kwargs), make(name, **kwargs)
        here.reset(seed=seed)
        there.reset(seed=1000 + seed)
        for env in (here, there):  # a few moves in, so that FrozenLake's start is not shared
            for _ in range(seed % 3):
                if not env.done:
                    env.step(env.solver_turn())
        if here.done or there.done:
            continue
        said.append(there.state_text())
        truth.append(here.state_text())
        exact, share = here.perceive(format_turn(there.reasoning(), [there.solver_action()]))
        assert exact == (said[-1] == truth[-1])
        # chance, counted here word by word: the words that happen to sit in the same place
        a, b = said[-1].split(), truth[-1].split()
        same = sum(a[i] == b[i] for i in range(min(len(a), len(b))))
        assert share == pytest.approx(same / max(len(a), len(b)))
        assert share < 1.0 or exact
    assert np.mean([s != t for s, t in zip(said, truth, strict=True)]) > 0.4


def test_rollout_measures_perception_and_evaluation_logs_it():
    tok = build_tokenizer()
    agent = build_agent("tiny", tokenizer=tok)
    kw = {"plan_in_reasoning": False, "max_actions_per_turn": 2}
    envs = [make("sokoban", **kw) for _ in range(3)]
    eps = rollout(agent.policy, tok, envs, [0, 1, 2], max_turns=5, measure_perception=True,
                  turn_fn=lambda e: e.solver_turn())  # fmt: skip
    assert all(e.state_turns == e.turns == e.state_exact > 0 for e in eps)
    # a blind writer: always the state of a fixed other room
    other = make("sokoban", **kw)
    other.reset(seed=99)
    blind = rollout(agent.policy, tok, envs, [0, 1, 2], max_turns=5, measure_perception=True,
                    turn_fn=lambda e: format_turn(other.state_text(), [e.solver_action()]))  # fmt: skip
    stats = episode_stats(collate(eps + blind, tok.pad_token_id), "eval")
    turns = sum(e.turns for e in eps + blind)
    right = sum(e.turns for e in eps) + sum(e.state_exact for e in blind)
    assert stats["eval/state_exact"] == pytest.approx(right / turns)
    assert 0 < stats["eval/state_exact"] < stats["eval/state_tokens"] < 1
    # not measured: not logged
    eps = rollout(agent.policy, tok, envs[:1], [0], max_turns=1, turn_fn=lambda e: e.solver_turn())
    assert "eval/state_exact" not in episode_stats(collate(eps, tok.pad_token_id), "eval")


# --------------------------------------------------------------------------- paper env forms


def test_frozenlake_coordinates_observation_by_hand():
    env = make("frozenlake", desc=["SFFF", "FHFH", "FFFH", "HFFG"], observation="coords")
    obs, _ = env.reset()
    head, *grid = obs.splitlines()
    assert head == (
        "board 4 x 4 . start 0 0 . goal 3 3 . player 0 0 . holes 1 1 , 1 3 , 2 3 , 3 0 ."
    )
    assert grid == ["P _ _ _", "_ O _ O", "_ _ _ O", "O _ _ G"]
    env.step("<answer> Down </answer>")
    obs, *_ = env.step("<answer> Right </answer>")  # into the hole at (1, 1)
    assert "player 1 1" in obs and obs.splitlines()[2] == "_ X _ O"
    assert env.state_text() == "i am at row 1 col 1 . goal at row 3 col 3"
    with pytest.raises(ValueError, match="observation must be one of grid, coords"):
        make("frozenlake", observation="pixels")


def test_frozenlake_scratchpad_names_the_holes_next_to_the_player():
    env = make("frozenlake", desc=["SFF", "FHF", "FFG"], plan_in_reasoning=False)
    env.reset()
    assert env.reasoning() == "i am at row 0 col 0 . goal at row 2 col 2 . holes near : none"
    env.step("<answer> Right </answer>")
    assert env.reasoning() == "i am at row 0 col 1 . goal at row 2 col 2 . holes near : Down"
    assert "plan" not in env.solver_turn().split("</think>")[0]


def test_strict_format_makes_a_turn_without_both_spans_invalid():
    level = ["#######", "#P_X_O#", "#######"]
    loose = make("sokoban", level=level)
    strict = make("sokoban", level=level, strict_format=True)
    for text, ok_strict in [
        ("<think> x </think> <answer> Right </answer>", True),
        ("<think></think><answer>Right</answer>", True),
        ("<answer> Right </answer>", False),  # no scratchpad
        ("hello <think> x </think> <answer> Right </answer>", False),  # text before
        ("<think> x </think> <answer> Right </answer> more", False),  # text after
        ("<think> x <answer> Right </answer>", False),  # scratchpad not closed
        ("<think> x </think> <think> y </think> <answer> Right </answer>", False),
    ]:
        for env, ok in ((loose, True), (strict, ok_strict)):
            env.reset()
            _, r, _, _, info = env.step(text)
            assert info["invalid"] == (not ok), (text, env.strict_format)
            assert r == pytest.approx(-0.1)  # a move costs what an invalid turn costs here


@pytest.mark.parametrize("name", ["sokoban", "frozenlake"])
def test_two_moves_a_turn_solver_and_three_is_invalid(name):
    kw = {"max_actions_per_turn": 2, "max_steps": 10, "strict_format": True}
    wins = 0
    for seed in range(30):
        env = make(name, **kw)
        env.reset(seed=seed)
        for _turn in range(5):
            moves = env.solver_moves()
            assert 1 <= len(moves) <= 2
            *_, term, trunc, info = env.step(env.solver_turn())
            assert not info["invalid"]
            if term or trunc:
                break
        wins += info["success"]
    assert wins >= 28  # 10 moves in 5 turns is enough for the generated levels
    env = make(name, **kw)
    env.reset(seed=0)
    before = env.render()
    obs, r, *_, info = env.step("<think> x </think> <answer> Up || Up || Up </answer>")
    assert info["invalid"] and obs == before and r == pytest.approx(-0.1)


def test_evaluation_cycles_through_fixed_maps():
    from tokenergy.rollout.episodes import eval_seeds

    assert eval_seeds(5, 100, 2) == [100, 101, 100, 101, 100]  # the paper: 32 maps x 16
    assert eval_seeds(3, 100, 0) == [100, 101, 102]  # one map an episode


def test_sudoku_lists_the_valid_digits_and_takes_comma_answers():
    env = make("sudoku4", observation="candidates", plan_in_reasoning=False)
    obs, _ = env.reset(seed=0)
    grid, cells = obs.splitlines()[:4], obs.splitlines()[4:]
    empty = [(r, c) for r in range(4) for c in range(4) if grid[r].split()[c] == "_"]
    assert len(cells) == len(empty) == int((env.grid == 0).sum())
    for line, (r, c) in zip(cells, empty, strict=True):
        valid = [
            v
            for v in range(1, 5)
            if env.clone().step(f"<answer> {r + 1} {c + 1} {v} </answer>")[4]["invalid"] is False
        ]
        assert line == f"row {r + 1} col {c + 1} can be " + " ".join(map(str, valid))
    r, c = empty[0]
    v = int(env.solution[r, c])
    assert re.fullmatch(r"[1-4],[1-4],[1-4]", env.solver_action())  # the paper's answer form
    for text in (f"{r + 1},{c + 1},{v}", f"{r + 1} , {c + 1} , {v}"):
        twin = env.clone()
        _, reward, *_, info = twin.step(f"<think> x </think> <answer> {text} </answer>")
        assert reward == 1.0 and not info["invalid"]
    assert "fill" not in env.solver_turn()

"""Text envs: the contract, determinism, Gymnasium parity, solvers, hand-worked episodes, and
that no text whatsoever makes them raise."""

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenergy.envs import TEXT_ENVS, make
from tokenergy.envs.frozenlake import MOVES
from tokenergy.envs.sokoban import parse_level, solve
from tokenergy.envs.sudoku import count_solutions
from tokenergy.envs.text import extract_answer, split_actions

PAPER = {"max_actions_per_turn": 2, "max_steps": 10, "strict_format": True}  # ActFocus's form
PAPER_CODE = {**PAPER, "extra_actions": "drop"}  # and its code's handling of extra moves
ENV_ARGS = {
    "frozenlake": [
        {},
        {"is_slippery": True},
        {"map_size": 5},
        {**PAPER, "is_slippery": True, "observation": "coords", "plan_in_reasoning": False},
        {**PAPER_CODE, "is_slippery": True, "observation": "coords", "plan_in_reasoning": False},
    ],
    "sokoban": [
        {},
        {"num_boxes": 2, "size": 7},
        {**PAPER, "plan_in_reasoning": False},
        {**PAPER_CODE, "plan_in_reasoning": False},
    ],
    "sudoku4": [
        {},
        {"num_holes": 10},
        {"observation": "candidates", "plan_in_reasoning": False, "strict_format": True},
    ],
    "tree_search": [{}, {"k": 3, "depth": 3, "goal": "zipf"}],
    "treasure": [{}, {"difficulty": 4}],
}
ALL = [(n, kw) for n, kws in ENV_ARGS.items() for kw in kws]


def answer(move: str) -> str:
    return f"<think> x </think> <answer> {move} </answer>"


def play_solver(env, seed):
    obs, _ = env.reset(seed=seed)
    while True:
        obs, r, term, trunc, info = env.step(env.solver_turn())
        assert isinstance(obs, str) and isinstance(r, float)
        if term or trunc:
            return info


def test_registry_lists_the_envs():
    assert {"frozenlake", "sokoban", "sudoku4", "tree_search", "treasure"} <= set(TEXT_ENVS)
    with pytest.raises(KeyError, match="did you mean 'sokoban'"):
        make("sokoban2")


@pytest.mark.parametrize(("name", "kwargs"), ALL)
def test_env_checker_and_determinism(name, kwargs):
    """reset/step types, info keys, same seed same episode, clone is independent."""
    a, b = make(name, **kwargs), make(name, **kwargs)
    obs_a, info = a.reset(seed=7)
    obs_b, _ = b.reset(seed=7)
    assert obs_a == obs_b and isinstance(info, dict)
    rng = np.random.default_rng(0)
    for _ in range(30):
        text = answer(a.random_action(rng)) if rng.random() < 0.5 else a.solver_turn()
        out_a, out_b = a.step(text), b.step(text)
        assert out_a == out_b
        _, _r, term, trunc, info = out_a
        assert isinstance(term, bool) and isinstance(trunc, bool) and "invalid" in info
        if term or trunc:
            assert isinstance(info["success"], bool)
            with pytest.raises(RuntimeError, match="reset"):
                a.step(text)
            break

    # a different seed gives a different level (over a few seeds); tree_search hides its goal
    def level(seed):
        env = make(name, **kwargs)
        return env.reset(seed=seed)[0] + str(getattr(env, "goal", ""))

    assert len({level(s) for s in range(5)}) > 1


@pytest.mark.parametrize(("name", "kwargs"), ALL)
def test_clone_is_independent(name, kwargs):
    env = make(name, **kwargs)
    env.reset(seed=3)
    copy = env.clone()
    before = copy.render()
    turn = env.solver_turn()
    out = env.step(turn)
    assert copy.render() == before  # stepping the original left the copy alone
    assert copy.step(turn) == out  # and the copy (its random generator too) replays it exactly


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("frozenlake", {}),
        ("frozenlake", {"map_size": 6}),
        ("frozenlake", {"layout": "random"}),
        ("sokoban", {}),
        ("sokoban", {"num_boxes": 2, "size": 7}),
        ("sudoku4", {}),
        ("sudoku4", {"num_holes": 10}),
        ("tree_search", {"k": 3, "depth": 3}),
        ("treasure", {"difficulty": 0}),
        ("treasure", {"difficulty": 6}),
    ],
)
def test_solver_solves_every_generated_level(name, kwargs):
    for seed in range(60):
        # tree_search's budget (k^depth leaf visits) is its step limit
        steps = {} if name == "tree_search" else {"max_steps": 40}
        info = play_solver(make(name, **kwargs, **steps), seed)
        assert info["success"], f"{name} {kwargs} seed {seed}"


def test_slippery_solver_beats_random():
    solver = np.mean(
        [
            play_solver(make("frozenlake", is_slippery=True, max_steps=30), s)["success"]
            for s in range(80)
        ]
    )
    rng = np.random.default_rng(0)
    wins = 0
    for s in range(80):
        env = make("frozenlake", is_slippery=True, max_steps=30)
        env.reset(seed=s)
        while True:
            *_, term, trunc, info = env.step(answer(MOVES[rng.integers(4)]))
            if term or trunc:
                wins += info["success"]
                break
    assert solver > 0.4 and solver > 3 * wins / 80


def test_frozenlake_random_layout_puts_start_and_goal_anywhere():
    """The paper's maps: start and goal on two distinct cells, every cell used by both over
    many maps, a path between them, the observation naming both; corners stay the default."""
    starts, goals = set(), set()
    for seed in range(400):
        env = make("frozenlake", layout="random", observation="coords")
        obs, _ = env.reset(seed=seed)
        (sr, sc), (gr, gc) = env._find("S")[0], env._find("G")[0]
        assert (sr, sc) != (gr, gc) and env.pos == (sr, sc)
        assert f"start {sr} {sc} . goal {gr} {gc} . player {sr} {sc}" in obs
        starts.add((sr, sc))
        goals.add((gr, gc))
    assert len(starts) == len(goals) == 16
    corners = make("frozenlake")
    corners.reset(seed=3)
    assert corners.desc[0][0] == "S" and corners.desc[-1][-1] == "G"
    with pytest.raises(ValueError, match="layout must be one of"):
        make("frozenlake", layout="diagonal")


def test_frozenlake_headroom_dp_matches_simulation():
    """The headroom benchmark's exact two-moves-a-turn solver probability on one map agrees
    with playing the solver's turns (each seed's slips drawn by the env) 4000 times."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    from frozenlake_headroom import map_stats

    seed = 1_000_003
    exact = map_stats(seed, [10], 0.1, per_turn=2, layout="random")[10][4]
    kwargs = dict(is_slippery=True, max_steps=10, max_actions_per_turn=2, layout="random")
    env = make("frozenlake", **kwargs)
    wins, n, policy = 0, 4000, None
    for k in range(n):
        env.reset(seed=seed)
        env.rng = np.random.default_rng(k)  # the same map, fresh slips
        env._policy = policy  # the same map's value iteration, solved once
        while True:
            *_, term, trunc, info = env.step(env.solver_turn())
            if term or trunc:
                wins += info["success"]
                break
        policy = env._policy
    assert 0.05 < exact < 0.95
    assert abs(wins / n - exact) < 4 * np.sqrt(exact * (1 - exact) / n)


# --------------------------------------------------------------------------- FrozenLake parity

GYM_MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]


def test_frozenlake_matches_gymnasium_step_for_step():
    gym_env = gym.make("FrozenLake-v1", desc=GYM_MAP, is_slippery=False)
    ours = make("frozenlake", desc=GYM_MAP, max_steps=100)
    rng = np.random.default_rng(1)
    for episode in range(30):
        s, _ = gym_env.reset(seed=episode)
        ours.reset(seed=episode)
        while True:
            a = int(rng.integers(4))
            s, r, term, _trunc, _ = gym_env.step(a)
            _, r2, term2, _trunc2, info = ours.step(answer(MOVES[a]))
            assert divmod(int(s), 4) == ours.pos and r == r2 and term == term2
            if term or term2:
                assert info["success"] == (r == 1.0)
                break


def test_frozenlake_slippery_matches_gymnasium_in_distribution():
    """From (1, 2) the intended move or a perpendicular one, 1/3 each (Gymnasium's rule)."""
    n = 3000
    ours = make("frozenlake", desc=GYM_MAP, is_slippery=True)
    gym_env = gym.make("FrozenLake-v1", desc=GYM_MAP, is_slippery=True).unwrapped
    counts_ours, counts_gym = {}, {}
    for i in range(n):
        ours.reset(seed=i)
        ours.pos = (0, 2)
        ours.step(answer("Down"))
        counts_ours[ours.pos] = counts_ours.get(ours.pos, 0) + 1
        gym_env.reset(seed=i)
        gym_env.s = 2
        s, *_ = gym_env.step(1)
        counts_gym[divmod(int(s), 4)] = counts_gym.get(divmod(int(s), 4), 0) + 1
    assert set(counts_ours) == set(counts_gym) == {(0, 1), (1, 2), (0, 3)}
    for cell in counts_ours:
        assert abs(counts_ours[cell] / n - 1 / 3) < 0.03
        assert abs(counts_ours[cell] / n - counts_gym[cell] / n) < 0.04


# --------------------------------------------------------------------------- Sokoban by hand


def test_sokoban_hand_worked_episode():
    env = make("sokoban", level=["#######", "#P_X_O#", "#######"], max_steps=10)
    obs, _ = env.reset()
    assert obs.splitlines()[1] == "# P _ X _ O #"
    _, r, term, _, _ = env.step(answer("Left"))  # into the wall: no move, still costs
    assert r == pytest.approx(-0.1) and env.player == (1, 1) and not term
    _, r, term, _, _ = env.step(answer("Right"))
    assert r == pytest.approx(-0.1) and env.player == (1, 2)
    _, r, term, _, _ = env.step(answer("Right"))  # pushes the box to (1, 4)
    assert r == pytest.approx(-0.1) and env.boxes == frozenset({(1, 4)})
    _, r, term, _, info = env.step(answer("Right"))  # box onto the target: +1 +10 -0.1
    assert r == pytest.approx(10.9) and term and info["success"]
    assert env.render().splitlines()[1] == "# _ _ _ P √ #"


def test_sokoban_box_off_target_costs_one():
    env = make("sokoban", level=["#######", "#P√___#", "#_XO__#", "#######"], max_steps=10)
    env.reset()
    _, r, term, _, _ = env.step(answer("Right"))  # pushes the placed box off its target
    assert r == pytest.approx(-1.1) and not term and env.boxes == frozenset({(1, 3), (2, 2)})


def test_sokoban_solver_is_shortest_and_levels_validate():
    walls, targets, boxes, player, _ = parse_level(["#######", "#P_X_O#", "#######"])
    assert solve(walls, targets, boxes, player) == [2, 2, 2]
    with pytest.raises(ValueError, match="as many boxes as targets"):
        make("sokoban", level=["#####", "#PX_#", "#####"])
    with pytest.raises(ValueError, match="unknown symbol"):
        make("sokoban", level=["#####", "#PXO?", "#####"])


def test_sokoban_several_moves_per_turn_and_cap():
    env = make("sokoban", level=["#######", "#P_X_O#", "#######"], max_actions_per_turn=3)
    env.reset()
    _, r, term, _, info = env.step(answer("Right || Right || right"))
    assert term and info["success"] and r == pytest.approx(-0.3 + 11)
    env.reset()
    _, r, _, _, info = env.step(answer("Right || Right || Right || Right"))
    assert info["invalid"] and env.player == (1, 1) and r == pytest.approx(-0.1)


@pytest.mark.parametrize("name", ["sokoban", "frozenlake"])
def test_extra_actions_drop_plays_the_first_moves_as_the_papers_code(name):
    level = {"level": ["#########", "#P______#", "#_X____O#", "#########"]}
    kw = level if name == "sokoban" else {"desc": ["SFFF", "FFFF", "FFFF", "FFFG"]}
    env = make(name, **kw, max_actions_per_turn=2, extra_actions="drop")
    start = env.reset()[0]
    at = lambda e: e.player if name == "sokoban" else e.pos  # noqa: E731
    _, _, _, _, info = env.step(answer("Right || Right || Down || Up"))  # 4 moves: 2 played
    assert not info["invalid"] and at(env) == ((1, 3) if name == "sokoban" else (0, 2))
    assert env.steps == 2
    _, _, _, _, info = env.step(answer("Right || || || Right"))  # empty parts are skipped
    assert not info["invalid"] and env.steps == 4
    for bad in ("|| ||", "Right || Jump", "Jump || Right || Right"):  # nothing, an unknown move
        before = env.steps
        _, r, _, _, info = env.step(answer(bad))
        assert info["invalid"] and r == pytest.approx(-0.1) and env.steps == before + 1
    strict = make(name, **kw, max_actions_per_turn=2)  # the default: too many moves is invalid
    assert strict.reset()[0] == start
    assert strict.step(answer("Right || Right || Down"))[4]["invalid"]
    assert strict.step(answer("Right || || Right"))[4]["invalid"]
    with pytest.raises(ValueError, match="extra_actions must be one of invalid, drop"):
        make(name, **kw, extra_actions="keep")


# --------------------------------------------------------------------------- Sudoku


def test_sudoku_puzzles_have_unique_solutions():
    for seed in range(20):
        env = make("sudoku4", num_holes=8)
        env.reset(seed=seed)
        assert (env.grid == 0).sum() >= 6
        assert count_solutions(env.grid.copy()) == 1
        sol = env.solution
        for i in range(4):
            assert sorted(sol[i]) == [1, 2, 3, 4] and sorted(sol[:, i]) == [1, 2, 3, 4]


def test_sudoku_rewards_by_hand():
    env = make("sudoku4", num_holes=6)
    env.reset(seed=0)
    r, c = map(int, np.argwhere(env.grid == 0)[0])
    good = int(env.solution[r, c])
    legal_wrong = [
        v for v in range(1, 5) if v != good and v not in set(env.grid[r]) | set(env.grid[:, c])
    ]
    filled = tuple(map(int, np.argwhere(env.grid != 0)[0]))
    _, rew, _, _, info = env.step(answer(f"{filled[0] + 1} {filled[1] + 1} 1"))
    assert info["invalid"] and rew == env.invalid_penalty
    if legal_wrong:
        before = env.grid.copy()
        _, rew, _, _, info = env.step(answer(f"{r + 1} {c + 1} {legal_wrong[0]}"))
        assert not info["invalid"] and rew == env.wrong_penalty and (env.grid == before).all()
    _, rew, _, _, info = env.step(answer(f"{r + 1} {c + 1} {good}"))
    assert rew == 1.0 and env.grid[r, c] == good


# --------------------------------------------------------------------------- parsing


def test_extract_and_split():
    assert extract_answer("<think>a</think><answer> Up || left </answer>") == "Up || left"
    assert extract_answer("no tags") is None
    assert extract_answer("<answer>" + "x" * 5000 + "</answer>") is None
    assert split_actions("Up ||  Left|| ") == ["Up", "Left", ""]


@pytest.mark.parametrize(("name", "kwargs"), ALL)
@settings(max_examples=60, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=200),
        st.text(max_size=50).map(lambda s: f"<answer>{s}</answer>"),
        st.sampled_from(
            [
                "<answer></answer>",
                "<answer> || </answer>",
                "<answer>Up||</answer>",
                "<answer>\x00</answer>",
                "<answer>1 1 ５</answer>",
                "<answer>" + "Up " * 3000 + "</answer>",
            ]
        ),
    )
)
def test_arbitrary_text_never_raises(name, kwargs, text):
    env = make(name, **kwargs)
    env.reset(seed=0)
    before = env.render()
    obs, r, _term, _trunc, info = env.step(text)
    assert isinstance(obs, str) and isinstance(r, float)
    if info["invalid"]:
        assert obs == before and r == env.invalid_penalty  # state unchanged
    assert env.steps == 1


# --------------------------------------------------------------------------- tree_search


def test_tree_search_hand_worked_episode():
    env = make("tree_search", k=2, depth=2)
    assert env.reset(seed=0, options={"goal": (1, 0)})[0] == "at root . depth 0 of 2"
    steps = [env.step(answer(m)) for m in ("1", "1", "2", "1")]
    assert [s[0] for s in steps] == [
        "at node 1 . depth 1 of 2",
        "FAIL . back at root . depth 0 of 2",
        "at node 2 . depth 1 of 2",
        "goal found",
    ]
    assert [s[1] for s in steps] == [0.0, 0.0, 0.0, 1.0]
    assert steps[-1][2] and steps[-1][4]["success"]
    assert env.visited == [(0, 0), (1, 0)]


def test_tree_search_discount_budget_and_chained_moves():
    env = make("tree_search", k=2, depth=2, gamma=0.9)
    env.reset(options={"goal": (1, 1)})
    (*_,) = env.step(answer("1 || 2"))  # one turn, two moves: leaf (0, 1), FAIL
    obs, r, term, trunc, _ = env.step(answer("2 || 2"))  # moves 2 and 3: the goal at t = 3
    assert (r, term) == (pytest.approx(0.9**3), True)
    env = make("tree_search", k=2, depth=2, budget=2)
    env.reset(options={"goal": (1, 1)})
    for m in ("1", "1", "1"):
        assert env.step(answer(m))[3] is False
    *_, term, trunc, info = env.step(answer("2"))  # the second leaf visit spends the budget
    assert (term, trunc, info["success"]) == (False, True, False)
    env = make("tree_search", k=2, depth=2)
    env.reset(options={"goal": (0, 0)})
    obs, r, *_, info = env.step(answer("3"))  # no child 3 in a binary tree
    assert info["invalid"] and obs == "at root . depth 0 of 2" and r == 0.0
    with pytest.raises(ValueError, match="k must be"):
        make("tree_search", k=1)
    with pytest.raises(ValueError, match="goal must be"):
        make("tree_search").reset(options={"goal": (0, 5)})


def test_tree_search_solver_is_dfs_without_revisits():
    k, d = 3, 3
    for goal in [(0, 0, 0), (2, 2, 2), (1, 0, 2)]:
        env = make("tree_search", k=k, depth=d)
        env.reset(options={"goal": goal})
        while not env.done:
            env.step(env.solver_turn())
        assert env.found and len(set(env.visited)) == len(env.visited)
        # index-order DFS: the goal is the (goal as a base-k number + 1)-th leaf visited
        assert len(env.visited) == sum(g * k ** (d - 1 - i) for i, g in enumerate(goal)) + 1


def test_tree_search_zipf_goals_and_ranked_solver():
    env = make("tree_search", k=3, depth=1, goal="zipf", zipf_s=1.0)
    firsts = []
    for seed in range(3000):
        env.reset(seed=seed)
        firsts.append(env.goal[0])
    freq = np.bincount(firsts, minlength=3) / len(firsts)
    expected = np.array([1, 1 / 2, 1 / 3]) / (1 + 1 / 2 + 1 / 3)
    assert np.allclose(freq, expected, atol=0.03)
    # with goals likelier on low branches, ranked DFS finds them in fewer leaf visits on average
    # than the uniform mean (k^d + 1) / 2
    env = make("tree_search", k=3, depth=2, goal="zipf", zipf_s=1.5)
    visits = []
    for seed in range(300):
        env.reset(seed=seed)
        while not env.done:
            env.step(env.solver_turn())
        visits.append(len(env.visited))
    assert np.mean(visits) < (3**2 + 1) / 2 - 1.5


# --------------------------------------------------------------------------- treasure


def test_treasure_hand_worked_episode():
    env = make("treasure", difficulty=2, show_map=False)
    obs, _ = env.reset(seed=3)
    assert obs == (
        "room armory . items : none . exits : east cave , north pantry . carry : nothing .\n"
        "actions : go east || go north"
    )
    assert env.reasoning() == "key in forge . route : north east"
    moves = ["go north", "go east", "take key", "go east"]
    rewards = [env.step(answer(m))[1] for m in moves]
    assert rewards == pytest.approx([-0.01, -0.01, 4.99, -0.01])
    assert env.render().startswith("room library . items : none . exits : east chapel locked ,")
    # the locked door: going through it is not an action; unlocking is (the key is carried)
    obs, r, *_, info = env.step(answer("go east"))
    assert info["invalid"] and r == -0.1 and obs.startswith("room library")
    assert env.step(answer("unlock east"))[1] == pytest.approx(-0.01)
    assert env.step(answer("go east"))[0].startswith("room chapel . items : treasure")
    obs, r, term, trunc, info = env.step(answer("take treasure"))
    assert r == pytest.approx(9.99) and term and not trunc and info["success"]


def test_treasure_rules():
    env = make("treasure", difficulty=3, max_steps=50)
    for seed in range(40):
        env.reset(seed=seed)
        # the key never lies behind the locked door, and the treasure room is a dead end
        assert env.key_room != env.treasure_room and len(env.exits[env.treasure_room]) == 1
        assert set(env.door) == {env.treasure_room, *env.exits[env.treasure_room].values()}
        while not env.done:
            legal = env.legal_actions()
            assert env.observation().endswith("actions : " + " || ".join(legal))
            assert not any(a.startswith("unlock") for a in legal) or env.has_key
            move = env.solver_action()
            key_before = env.has_key
            r = env.step(answer(move))[1]
            if move == "take key":
                assert r == pytest.approx(4.99) and env.has_key and not key_before
                assert "take key" not in env.legal_actions()  # the key is taken once
    with pytest.raises(ValueError, match="difficulty"):
        make("treasure", difficulty=7)


def test_treasure_map_opens_the_episode():
    env = make("treasure", difficulty=2)
    obs, _ = env.reset(seed=3)
    assert obs.splitlines()[0] == (
        "map : armory east cave , armory north pantry , pantry east forge , forge east library , "
        "library east chapel locked , library south hall . key : forge . treasure : chapel ."
    )
    assert obs.splitlines()[1:] == env.render().splitlines()
    assert "map" not in env.step(answer("go north"))[0]  # it is in the context already
    for seed in range(20):
        env = make("treasure", difficulty=4)
        first = env.reset(seed=seed)[0].splitlines()[0]
        assert first.count(" , ") + 1 == len(env.names) - 1  # a tree: rooms - 1 passages
        assert first.count(" locked") == 1

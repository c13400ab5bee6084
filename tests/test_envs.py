"""The bottleneck gridworld and the batched env: checker, determinism, hand-worked episodes."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import tokenergy.envs  # noqa: F401  (registers tokenergy/BottleneckGrid-v0)
from tokenergy.envs import BatchedEnv, BottleneckGridEnv

LEFT, DOWN, RIGHT, UP = range(4)


def test_passes_gymnasium_checker():
    check_env(BottleneckGridEnv(), skip_render_check=True)
    check_env(gym.make("tokenergy/BottleneckGrid-v0").unwrapped, skip_render_check=True)


def test_default_layout_text():
    env = BottleneckGridEnv(render_mode="ansi")
    env.reset(seed=0)
    rows = env.render().splitlines()
    assert len(rows) == 10 and all(len(r) == 10 for r in rows)
    assert rows[0][0] == "A" and rows[9][9] == "G"
    assert rows[5] == "###T.T####"  # wall row 5, passage column 4, traps beside it
    assert env.shortest_path_length() == 18


def test_hand_worked_optimal_episode():
    env = BottleneckGridEnv()
    obs, _ = env.reset(seed=0)
    assert obs.argmax() == 0 and obs.sum() == 1.0
    path = [RIGHT] * 4 + [DOWN] * 9 + [RIGHT] * 5
    total, rewards = 0.0, []
    for i, a in enumerate(path):
        obs, r, term, trunc, info = env.step(a)
        rewards.append(r)
        total += r
        assert term == (i == len(path) - 1) and not trunc
    assert info["success"] is True and env.pos == (9, 9)
    assert obs.argmax() == 99
    assert total == pytest.approx(1.0 - 0.01 * 17)


def test_trap_wall_and_edges():
    env = BottleneckGridEnv()
    env.reset(seed=0)
    _, r, term, _, _ = env.step(UP)  # off the grid: stays
    assert env.pos == (0, 0) and r == pytest.approx(-0.01) and not term
    for a in [RIGHT, RIGHT, RIGHT] + [DOWN] * 4:
        env.step(a)
    assert env.pos == (4, 3)
    _, r, term, _, info = env.step(DOWN)  # (5, 3) is a trap
    assert term and r == -1.0 and info["success"] is False and info["trapped"]
    env.reset(seed=0)
    for a in [DOWN] * 4:
        env.step(a)
    env.step(DOWN)  # (5, 0) is wall: stays
    assert env.pos == (4, 0)


def test_time_limit_truncates():
    env = gym.make("tokenergy/BottleneckGrid-v0")
    env.reset(seed=0)
    for _ in range(100):
        _, _, term, trunc, info = env.step(UP)
        assert not term
    assert trunc and info["success"] is False


def test_constructor_arguments_and_errors():
    env = BottleneckGridEnv(size=6, passage_width=2, passage_col=0, traps=[(2, 5)])
    assert env.grid[3, 0] == "." and env.grid[3, 1] == "." and env.grid[3, 2] == "#"
    assert env.grid[2, 5] == "T"
    assert env.observation_space.shape == (36,)
    with pytest.raises(ValueError, match="size"):
        BottleneckGridEnv(size=3)
    with pytest.raises(ValueError, match="passage_col"):
        BottleneckGridEnv(passage_col=9, passage_width=2)
    with pytest.raises(ValueError, match="traps"):
        BottleneckGridEnv(traps="everywhere")
    with pytest.raises(ValueError, match="cannot be reached"):
        BottleneckGridEnv(size=5, passage_width=1, passage_col=2, traps=[(3, 2)])
    with pytest.raises(ValueError, match="action"):
        BottleneckGridEnv().step(7)


def test_same_seed_same_episode():
    def rollout(seed):
        env = gym.make("tokenergy/BottleneckGrid-v0")
        env.reset(seed=seed)
        env.action_space.seed(seed)
        out = []
        for _ in range(50):
            obs, r, term, trunc, _ = env.step(env.action_space.sample())
            out.append((obs.argmax(), r, term))
            if term or trunc:
                env.reset()
        return out

    assert rollout(3) == rollout(3)


def test_batched_env_autoreset_keeps_final_observation():
    env = BatchedEnv.make("tokenergy/BottleneckGrid-v0", 2, size=4, passage_col=0, traps="none")
    obs = env.reset(seed=0)
    assert obs.shape == (2, 16)
    # env 0 walks to the goal (3,3) of a 4x4 grid through the passage at column 0; env 1 idles
    for a in [DOWN, DOWN, DOWN, RIGHT, RIGHT]:
        step = env.step(np.array([a, UP]))
        assert not step.terminated.any()
    step = env.step(np.array([RIGHT, UP]))
    assert step.terminated.tolist() == [True, False]
    assert step.final_obs[0].argmax() == 15  # the goal cell, before the reset
    assert step.obs[0].argmax() == 0  # the next episode's start
    assert np.array_equal(step.final_obs[1], step.obs[1])
    (ep,) = step.episodes
    assert ep.env_index == 0 and ep.length == 6 and ep.success is True
    assert ep.ret == pytest.approx(1.0 - 5 * 0.01)


def test_batched_env_rejects_continuous_actions():
    with pytest.raises(ValueError, match="discrete action space"):
        BatchedEnv.make("Pendulum-v1", 1)

"""Vector-env PPO: learns a trivial task, parameters move, same seed same run, weighting schedule."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from tokenergy.algos.ppo import train_ppo, weight_scale_at
from tokenergy.config import load_config


class IdentityEnv(gym.Env):
    """One-step episodes: observe a one-hot class, reward 1 for naming it (SB3's identity env)."""

    def __init__(self, n: int = 3):
        self.n = n
        self.observation_space = gym.spaces.Box(0.0, 1.0, (n,), np.float32)
        self.action_space = gym.spaces.Discrete(n)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = int(self.np_random.integers(self.n))
        obs = np.zeros(self.n, np.float32)
        obs[self.state] = 1.0
        return obs, {}

    def step(self, action):
        reward = float(action == self.state)
        obs, _ = self.reset()
        return obs, reward, True, False, {"success": bool(reward)}


if "test/Identity-v0" not in gym.registry:
    gym.register("test/Identity-v0", entry_point=IdentityEnv)


def small(**overrides):
    base = {
        "env.id": "test/Identity-v0",
        "env.num_envs": 4,
        "ppo.num_steps": 32,
        "ppo.total_steps": 4 * 32 * 40,
        "ppo.lr": 3e-3,
        "ppo.minibatches": 2,
        "ppo.ent_coef": 0.0,
        "log.progress": False,
    }
    return load_config(None, {**base, **overrides})


def test_solves_identity_env():
    hist = train_ppo(small()).history
    assert hist[0]["rollout/return"] < 0.6  # chance is 1/3
    assert np.mean([r["rollout/return"] for r in hist[-5:]]) > 0.95


def test_energy_weighted_ppo_also_solves_identity_env():
    hist = train_ppo(small(**{"energy.weighting": "bottleneck", "energy.warmup_frac": 0.0})).history
    assert all(r["train/weighting_active"] == 1.0 for r in hist)
    assert np.mean([r["rollout/return"] for r in hist[-5:]]) > 0.95


def test_parameters_change_after_one_iteration():
    cfg = small(**{"ppo.total_steps": 128})
    torch.manual_seed(cfg.seed)
    from tokenergy.models import ActorCritic

    init = ActorCritic(3, 3, cfg.model.hidden_sizes, cfg.model.activation)
    trained = train_ppo(cfg).model
    for (name, p0), p1 in zip(init.named_parameters(), trained.parameters(), strict=True):
        assert not torch.equal(p0, p1), f"{name} did not move"


def _comparable(history):
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in history]


def test_same_seed_same_run_and_other_seed_differs():
    cfg = small(
        **{"ppo.total_steps": 4 * 32 * 4, "energy.weighting": "bottleneck", "energy.shuffle": True}
    )
    a, b = train_ppo(cfg).history, train_ppo(cfg).history
    assert _comparable(a) == _comparable(b)
    c = train_ppo(load_config(None, {**{"seed": 1}, **_small_overrides(cfg)})).history
    assert _comparable(a) != _comparable(c)


def _small_overrides(cfg):
    return {
        "env.id": cfg.env.id,
        "env.num_envs": cfg.env.num_envs,
        "ppo.num_steps": cfg.ppo.num_steps,
        "ppo.total_steps": cfg.ppo.total_steps,
        "ppo.minibatches": cfg.ppo.minibatches,
        "log.progress": False,
    }


def test_warmup_and_weight_scale_schedule():
    cfg = small(
        **{
            "ppo.total_steps": 4 * 32 * 10,
            "energy.weighting": "bottleneck",
            "energy.warmup_frac": 0.2,
            "energy.weight_scale": 3.0,
            "energy.weight_scale_final": 1.0,
        }
    )
    assert [weight_scale_at(cfg, i) for i in range(10)] == pytest.approx(
        [
            None,
            None,
            3.0,
            3.0 - 2 / 7,
            3.0 - 4 / 7,
            3.0 - 6 / 7,
            3.0 - 8 / 7,
            3.0 - 10 / 7,
            3.0 - 12 / 7,
            1.0,
        ]
    )
    hist = train_ppo(cfg).history
    assert [r["train/weighting_active"] for r in hist] == [0.0, 0.0] + [1.0] * 8
    assert hist[2]["weights/scale"] == 3.0 and hist[-1]["weights/scale"] == 1.0


def test_every_documented_metric_is_logged():
    from pathlib import Path

    doc = Path(__file__).parent.parent.joinpath("docs", "metrics.md").read_text()
    row = train_ppo(small(**{"ppo.total_steps": 128})).history[-1]
    for key in row:
        assert f"`{key}`" in doc, f"{key} is logged but not documented in docs/metrics.md"


def test_cuda_device_without_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        train_ppo(small(**{"device": "cuda"}))

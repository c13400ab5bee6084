"""Energy in the LM trainer: ActFocus weights reach the loss as configured, warm-up holds
them back, samples carry per-token energy and weight, and weights steer the gradient."""

import json

import pytest
import torch

from test_lm import tiny_cfg
from tokenergy.energy import actfocus_weights
from tokenergy.experiments import run_training
from tokenergy.losses import ppo_policy_loss
from tokenergy.types import Role


def _rows(path):
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]


def test_actfocus_run_logs_the_configured_weights_and_respects_warmup(tmp_path):
    cfg = tiny_cfg(
        **{
            "algo.iterations": 3,
            "energy.weighting": "actfocus",
            "energy.alpha": 0.25,
            "energy.warmup_iters": 1,
            "eval.every": 3,
            "eval.diagnose_seeds": 2,
            "eval.diagnose_group": 3,
        }
    )
    run_training(cfg, tmp_path / "run")
    rows = [r for r in _rows(tmp_path / "run") if "train/iteration" in r and "loss/policy" in r]
    assert [r["energy/active"] for r in rows] == [0.0, 1.0, 1.0]
    assert rows[0]["weights/reasoning"] == 1.0  # warm-up: plain token-mean
    for r in rows[1:]:
        assert r["weights/reasoning"] == pytest.approx(0.25)
        if r["rollout/action_token_share"] > 0:  # the paper's bounded action weights
            assert 1.0 <= r["weights/action"] <= 1.5
        assert "energy/lam" not in r  # the softmax form's strength, not this one's
    evals = [r for r in _rows(tmp_path / "run") if "diag/share_action" in r]
    assert len(evals) == 2  # before RL and at the end
    samples = [
        json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().split("\n") if x
    ]
    s = samples[-1]
    assert len(s["energy"]) == len(s["weight"]) == len(s["tokens"])
    for role, w in zip(s["roles"], s["weight"], strict=True):
        if role == int(Role.OBSERVATION):
            assert w == 0.0
        elif role == int(Role.REASONING):
            assert w == pytest.approx(0.25)


def test_zero_weights_stop_the_gradient_and_energy_gets_none():
    g = torch.Generator().manual_seed(0)
    roles = torch.tensor([[0, 1, 1, 2, 2, 3]])
    mask = roles != 0
    logprobs = (torch.randn(1, 6, generator=g) - 2).requires_grad_()
    energy = (-logprobs).detach().requires_grad_()  # a leaf that would collect a gradient
    w = actfocus_weights(roles, energy, mask, alpha=0.0, beta=0.5, format_weight=0.0)
    assert not w.requires_grad
    loss, _ = ppo_policy_loss(logprobs, logprobs.detach(), torch.ones(1, 6), mask, 0.2, weights=w)
    loss.backward()
    grad = logprobs.grad[0]
    assert grad[1] == 0 and grad[2] == 0 and grad[5] == 0  # reasoning and format tokens
    assert grad[3] != 0 and grad[4] != 0  # action tokens carry the whole signal
    assert energy.grad is None


def test_an_unused_reference_energy_costs_nothing(tmp_path):
    """Without a KL penalty and with the energy unused, no reference is kept and the reference
    energy is not logged; using it (ActFocus) brings the reference back."""
    from tokenergy.algos.lm import train_lm

    plain = tiny_cfg(**{"algo.kl_coef": 0.0})
    assert not plain.energy.needs_reference
    res = train_lm(plain)
    assert "energy/mean" not in res.history[-1] and "kl/ref" in res.history[-1]
    used = tiny_cfg(**{"algo.kl_coef": 0.0, "energy.weighting": "actfocus"})
    assert used.energy.needs_reference
    row = train_lm(used).history[-1]
    # the paper's energy, -logsumexp of the reference's logits, varies from token to token
    assert row["energy/active"] == 1.0 and row["energy/std"] > 0
    entropy_only = tiny_cfg(**{"algo.kl_coef": 0.0, "energy.source": "entropy"})
    assert "energy/mean" in train_lm(entropy_only).history[-1]


def test_critic_warmup_trains_the_value_head_alone():
    import copy

    from tokenergy.algos.lm import train_lm
    from tokenergy.models import build_agent

    agent = build_agent("tiny", seed=0)
    before = copy.deepcopy(agent.state_dict())
    cfg = tiny_cfg(**{"algo.critic_warmup_iters": 1, "algo.iterations": 1})
    res = train_lm(cfg, agent=agent)
    assert res.history[-1]["train/critic_only"] == 1.0
    after = agent.state_dict()
    for k, v in before.items():
        if k.startswith("policy."):
            assert torch.equal(v, after[k]), k
    assert any(
        not torch.equal(v, after[k]) for k, v in before.items() if k.startswith("value_head.")
    )
    with pytest.raises(Exception, match="only ppo has a value head"):
        tiny_cfg(**{"algo.critic_warmup_iters": 1, "algo.name": "grpo", "rollout.group_size": 2})

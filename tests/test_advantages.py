"""GAE and group-relative advantages: hand values, loop vs vectorised, analytic limits."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenergy.advantages import gae, group_relative, masked_mean, shuffled_returns, whiten


def gae_loop(rewards, values, next_values, terminated, ends, gamma, lam):
    """Scalar reference: the contract of `gae` written out one number at a time."""
    B, T = len(rewards), len(rewards[0])
    adv = [[0.0] * T for _ in range(B)]
    for b in range(B):
        nxt = 0.0
        for t in reversed(range(T)):
            delta = (
                rewards[b][t] + gamma * next_values[b][t] * (1 - terminated[b][t]) - values[b][t]
            )
            nxt = delta + gamma * lam * (1 - ends[b][t]) * nxt
            adv[b][t] = nxt
    return adv


def test_gae_hand_values():
    # One env, three steps, terminal at the last step; gamma=0.5, lam=0.5.
    r = torch.tensor([[1.0, 0.0, 2.0]])
    v = torch.tensor([[0.5, 1.0, 1.5]])
    nv = torch.tensor([[1.0, 1.5, 9.0]])  # 9.0 must be ignored: terminated
    term = torch.tensor([[False, False, True]])
    ends = term.clone()
    adv, ret = gae(r, v, nv, term, ends, gamma=0.5, lam=0.5)
    # deltas: 1 + .5*1 - .5 = 1.0 ; 0 + .5*1.5 - 1 = -0.25 ; 2 - 1.5 = 0.5
    # A2 = 0.5 ; A1 = -0.25 + .25*0.5 = -0.125 ; A0 = 1.0 + .25*(-0.125) = 0.96875
    assert torch.allclose(adv, torch.tensor([[0.96875, -0.125, 0.5]]))
    assert torch.allclose(ret, adv + v)


def test_truncation_bootstraps_but_termination_does_not():
    r = torch.zeros(1, 1)
    v = torch.zeros(1, 1)
    nv = torch.full((1, 1), 2.0)
    ends = torch.ones(1, 1, dtype=torch.bool)
    adv_trunc, _ = gae(r, v, nv, torch.zeros(1, 1, dtype=torch.bool), ends, 0.9, 0.95)
    adv_term, _ = gae(r, v, nv, torch.ones(1, 1, dtype=torch.bool), ends, 0.9, 0.95)
    assert adv_trunc.item() == pytest.approx(1.8)
    assert adv_term.item() == 0.0


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 7),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    seed=st.integers(0, 10_000),
)
def test_gae_matches_scalar_loop(B, T, gamma, lam, seed):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    nv = torch.randn(B, T, generator=g, dtype=torch.float64)
    term = torch.rand(B, T, generator=g) < 0.2
    ends = term | (torch.rand(B, T, generator=g) < 0.2)
    adv, _ = gae(r, v, nv, term, ends, gamma, lam)
    ref = gae_loop(
        r.tolist(), v.tolist(), nv.tolist(), term.int().tolist(), ends.int().tolist(), gamma, lam
    )
    assert torch.allclose(adv, torch.tensor(ref, dtype=torch.float64), atol=1e-10)


def test_split_at_terminal_equals_whole():
    g = torch.Generator().manual_seed(0)
    T = 9
    r, v, nv = (torch.randn(1, T, generator=g) for _ in range(3))
    term = torch.zeros(1, T, dtype=torch.bool)
    term[0, 3] = True
    ends = term.clone()
    ends[0, -1] = True
    whole, _ = gae(r, v, nv, term, ends, 0.97, 0.9)
    first, _ = gae(r[:, :4], v[:, :4], nv[:, :4], term[:, :4], ends[:, :4], 0.97, 0.9)
    second, _ = gae(r[:, 4:], v[:, 4:], nv[:, 4:], term[:, 4:], ends[:, 4:], 0.97, 0.9)
    assert torch.allclose(whole, torch.cat([first, second], dim=1))


def test_lambda_one_equals_monte_carlo():
    # Consistent values (next_values_t = values_{t+1}) and a terminal at the end: with lam=1
    # the returns are the discounted Monte-Carlo returns, whatever the values are.
    g = torch.Generator().manual_seed(1)
    T, gamma = 6, 0.9
    r = torch.randn(2, T, generator=g, dtype=torch.float64)
    v = torch.randn(2, T, generator=g, dtype=torch.float64)
    nv = torch.cat([v[:, 1:], torch.zeros(2, 1, dtype=torch.float64)], dim=1)
    term = torch.zeros(2, T, dtype=torch.bool)
    term[:, -1] = True
    _, ret = gae(r, v, nv, term, term.clone(), gamma, 1.0)
    mc = torch.zeros_like(r)
    running = torch.zeros(2, dtype=torch.float64)
    for t in reversed(range(T)):
        running = r[:, t] + gamma * running
        mc[:, t] = running
    assert torch.allclose(ret, mc)


def test_lambda_zero_is_one_step_td():
    g = torch.Generator().manual_seed(2)
    r, v, nv = (torch.randn(2, 5, generator=g) for _ in range(3))
    f = torch.zeros(2, 5, dtype=torch.bool)
    adv, _ = gae(r, v, nv, f, f, 0.9, 0.0)
    assert torch.allclose(adv, r + 0.9 * nv - v)


def test_gae_has_no_gradient_and_checks_shapes():
    v = torch.zeros(1, 3, requires_grad=True)
    f = torch.zeros(1, 3, dtype=torch.bool)
    adv, ret = gae(torch.ones(1, 3), v, torch.zeros(1, 3), f, f, 0.9, 0.9)
    assert not adv.requires_grad and not ret.requires_grad
    with pytest.raises(ValueError, match="one \\[B, T\\] shape"):
        gae(torch.ones(1, 3), torch.ones(1, 2), torch.ones(1, 3), f, f, 0.9, 0.9)


def test_group_relative_hand_values():
    rewards = torch.tensor([1.0, 3.0, 0.0, 5.0, 7.0])
    groups = torch.tensor([0, 0, 1, 2, 2])
    adv = group_relative(rewards, groups, scale="none")
    assert torch.allclose(adv, torch.tensor([-1.0, 1.0, 0.0, -1.0, 1.0]))
    # unbiased std of {1, 3} is sqrt(2)
    adv = group_relative(rewards, groups, scale="group", eps=0.0)
    s = 1 / math.sqrt(2)
    assert torch.allclose(adv, torch.tensor([-s, s, 0.0, -s, s]))
    batch_std = rewards.std(unbiased=True)
    adv = group_relative(rewards, groups, scale="batch", eps=0.0)
    assert torch.allclose(adv, torch.tensor([-1.0, 1.0, 0.0, -1.0, 1.0]) / batch_std)


def test_group_relative_invariants():
    g = torch.Generator().manual_seed(3)
    rewards = torch.randn(40, generator=g, dtype=torch.float64)
    groups = torch.randint(0, 6, (40,), generator=g)
    adv = group_relative(rewards, groups)
    for k in groups.unique():
        sel = groups == k
        if sel.sum() > 1:
            assert adv[sel].mean().abs() < 1e-9
            assert adv[sel].std() == pytest.approx(1.0, abs=1e-4)
    # shifting every reward by a constant changes nothing
    assert torch.allclose(group_relative(rewards + 10.0, groups), adv, atol=1e-9)
    with pytest.raises(ValueError, match="scale"):
        group_relative(rewards, groups, scale="bogus")


def test_group_of_identical_rewards_gets_zero_not_nan():
    adv = group_relative(torch.tensor([2.0, 2.0, 2.0]), torch.tensor([4, 4, 4]))
    assert torch.equal(adv, torch.zeros(3))


def test_whiten_and_masked_mean():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[True, True, True, False]])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    w = whiten(x, mask)
    assert w[0, 3] == 0.0
    assert masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-6)
    # population std of {1,2,3} is sqrt(2/3)
    assert w[0, 2].item() == pytest.approx(1 / math.sqrt(2 / 3), rel=1e-5)
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0


def test_high_variance_groups_keeps_the_groups_whose_returns_vary_most():
    from tokenergy.advantages import high_variance_groups

    # group 0: all failed alike (std 0); group 1: std 5; group 2: std 0.5; group 3: std 5
    returns = torch.tensor([-1.0, -1.0, 10.0, 0.0, 1.0, 0.0, 0.0, 10.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    kept = high_variance_groups(returns, groups, 0.25)  # one group of four: the first std-5 one
    assert kept.tolist() == [False, False, True, True, False, False, False, False]
    kept = high_variance_groups(returns, groups, 0.5)
    assert kept.tolist() == [False, False, True, True, False, False, True, True]
    assert high_variance_groups(returns, groups, 1.0).all()
    # at least one group, however small the share
    assert high_variance_groups(returns, groups, 0.01).sum() == 2


def test_shuffled_returns_move_each_return_to_another_episodes_last_token():
    rewards = torch.tensor([[0.0, -0.1, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 3.0]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0], [0, 1, 1, 1]]).bool()
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(3, generator=torch.Generator().manual_seed(0))
    out = shuffled_returns(rewards, mask, gen)
    want = torch.zeros_like(rewards)
    for i, last in enumerate([3, 2, 3]):
        want[i, last] = rewards.sum(1)[perm[i]]
    assert torch.equal(out, want)
    # the returns keep their values, only their owners change
    assert sorted(out.sum(1).tolist()) == pytest.approx(sorted(rewards.sum(1).tolist()))
    assert not (out * ~mask).any()

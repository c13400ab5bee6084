"""PPO policy, value and KL losses: hand values, gradients, analytic expectations."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenergy.losses import kl_estimate, ppo_policy_loss, value_loss


def test_ppo_policy_loss_hand_values():
    # ratios 1.5, 0.5, 1.0 with eps=0.2; advantages +1, +1, -2
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, 1.0, -2.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, m = ppo_policy_loss(logp, old, adv, mask, clip_eps=0.2)
    # token 0: max(-1.5, -1.2) = -1.2 ; token 1: max(-0.5, -0.8) = -0.5 ; token 2: 2.0
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 2.0) / 3)
    assert m["clipfrac"].item() == pytest.approx(2 / 3)
    k3 = [(r - 1) - math.log(r) for r in (1.5, 0.5, 1.0)]
    assert m["approx_kl"].item() == pytest.approx(sum(k3) / 3, rel=1e-5)


def test_weights_and_mask():
    logp = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.tensor([[True, True, True, False]])
    w = torch.tensor([[2.0, 0.0, 1.0, 5.0]])
    loss, _ = ppo_policy_loss(logp, logp.clone(), adv, mask, 0.2, weights=w)
    # sum(mask * w * -A) / sum(mask) = (-2 - 0 - 3) / 3
    assert loss.item() == pytest.approx(-5 / 3)
    # the paper's normalisation: / sum(mask * w) = (-2 - 0 - 3) / (2 + 0 + 1) (here as many as
    # the tokens); the masked token's weight 5 counts in neither sum
    loss, _ = ppo_policy_loss(logp, logp.clone(), adv, mask, 0.2, weights=w, normalize="weights")
    assert loss.item() == pytest.approx(-5 / 3)
    w2 = torch.tensor([[0.5, 1.5, 3.0, 5.0]])
    loss, _ = ppo_policy_loss(logp, logp.clone(), adv, mask, 0.2, weights=w2, normalize="weights")
    assert loss.item() == pytest.approx((-0.5 - 3.0 - 9.0) / 5.0)
    # uniform weights: both normalisations are the token mean
    ones = torch.ones(1, 4)
    a, _ = ppo_policy_loss(logp, logp.clone(), adv, mask, 0.2, weights=ones, normalize="weights")
    b, _ = ppo_policy_loss(logp, logp.clone(), adv, mask, 0.2)
    assert a.item() == pytest.approx(b.item()) == pytest.approx(-2.0)
    with pytest.raises(ValueError, match="normalize must be"):
        ppo_policy_loss(logp, logp.clone(), adv, mask, 0.2, normalize="tokens")


def test_masked_tokens_get_exactly_zero_gradient():
    logp = torch.randn(2, 5, requires_grad=True)
    old = logp.detach() + 0.1 * torch.randn(2, 5)
    adv = torch.randn(2, 5)
    mask = torch.rand(2, 5) > 0.4
    mask[0, 0] = True
    weights = torch.rand(2, 5, requires_grad=True)
    loss, _ = ppo_policy_loss(logp, old, adv, mask, 0.2, weights=weights)
    loss.backward()
    assert torch.all(logp.grad[~mask] == 0.0)
    assert weights.grad is None  # weights are constants


def test_clip_eps_high_is_asymmetric():
    logp = torch.log(torch.tensor([[1.25]]))
    old = torch.zeros(1, 1)
    adv = torch.ones(1, 1)
    mask = torch.ones(1, 1, dtype=torch.bool)
    sym, _ = ppo_policy_loss(logp, old, adv, mask, clip_eps=0.2)
    high, m = ppo_policy_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    assert sym.item() == pytest.approx(-1.2)
    assert high.item() == pytest.approx(-1.25)
    assert m["clipfrac"].item() == 0.0


def test_clipped_tokens_have_no_gradient_in_the_clipped_direction():
    logp = torch.log(torch.tensor([[1.5]])).requires_grad_(True)
    loss, _ = ppo_policy_loss(
        logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool), 0.2
    )
    loss.backward()
    assert logp.grad.item() == 0.0


def test_value_loss_hand_values():
    v = torch.tensor([[2.0, 0.0]])
    old = torch.tensor([[1.0, 0.0]])
    R = torch.tensor([[3.0, 1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, _ = value_loss(v, old, R, mask)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)
    # clip 0.5: token 0 clipped value 1.5 -> (1.5-3)^2 = 2.25 > 1 ; token 1 unchanged
    loss_c, m = value_loss(v, old, R, mask, clip=0.5)
    assert loss_c.item() == pytest.approx(0.5 * (2.25 + 1.0) / 2)
    assert m["value_clipfrac"].item() == pytest.approx(0.5)


def test_kl_estimators_hand_values():
    logp = torch.tensor([[math.log(0.5)]])
    logq = torch.tensor([[math.log(0.25)]])
    assert kl_estimate(logp, logq, "k1").item() == pytest.approx(math.log(2))
    assert kl_estimate(logp, logq, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_estimate(logp, logq, "k3").item() == pytest.approx(0.5 - 1 + math.log(2))
    with pytest.raises(ValueError):
        kl_estimate(logp, logq, "k4")


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), V=st.integers(2, 8))
def test_k1_and_k3_are_unbiased_and_k3_non_negative(seed, V):
    # Exact expectation over tokens drawn from p: E_p[k1] = E_p[k3] = KL(p || q).
    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
    logq = torch.log_softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
    p = logp.exp()
    kl = (p * (logp - logq)).sum()
    k1 = kl_estimate(logp[None], logq[None], "k1")[0]
    k3 = kl_estimate(logp[None], logq[None], "k3")[0]
    assert (p * k1).sum().item() == pytest.approx(kl.item(), abs=1e-9)
    assert (p * k3).sum().item() == pytest.approx(kl.item(), abs=1e-9)
    assert torch.all(k3 >= -1e-12)

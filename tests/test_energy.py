"""Energies and energy weightings: hand values, invariants, no gradient."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenergy.energy import (
    ENERGY_SOURCES,
    WEIGHTINGS,
    EnergyInputs,
    advantage_energy,
    bottleneck_weights,
    entropy,
    free_energy,
    shuffled_weights,
    surprisal,
)


def test_free_energy_entropy_surprisal_hand_values():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # p = (1/4, 3/4)
    assert free_energy(logits).item() == pytest.approx(-math.log(4.0))
    assert free_energy(logits, temperature=2.0).item() == pytest.approx(
        -2 * math.log(1 + math.sqrt(3))
    )
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy(logits).item() == pytest.approx(h)
    assert surprisal(logits, torch.tensor([[0]])).item() == pytest.approx(math.log(4.0))
    assert surprisal(logits, torch.tensor([[1]])).item() == pytest.approx(-math.log(0.75))


def test_energies_agree_with_torch_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 7, generator=g, requires_grad=True)
    tokens = torch.randint(0, 7, (3, 4), generator=g)
    dist = torch.distributions.Categorical(logits=logits)
    assert torch.allclose(entropy(logits), dist.entropy())
    assert torch.allclose(surprisal(logits, tokens), -dist.log_prob(tokens))
    for e in (entropy(logits), surprisal(logits, tokens), free_energy(logits)):
        assert not e.requires_grad


def test_advantage_energy():
    adv = torch.tensor([[-10.0, 0.0, 10.0]])
    e = advantage_energy(adv, beta=1.0)
    assert e[0, 1].item() == 0.5
    assert e[0, 0].item() > 0.99 and e[0, 2].item() < 0.01


def test_bottleneck_weights_hard_and_smooth_hand_values():
    energy = torch.tensor([[0.0, 0.0, 0.0, 4.0, 99.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    # masked: {0,0,0,4}: mean 1, population std sqrt(3); z(4) = 3/sqrt(3) = 1.732
    w = bottleneck_weights(energy, mask, threshold_std=1.5, weight_scale=2.0)
    assert w.tolist() == [[1.0, 1.0, 1.0, 2.0, 0.0]]
    w = bottleneck_weights(energy, mask, threshold_std=1.5, weight_scale=3.0, smooth=True)
    z0, z3 = -1 / math.sqrt(3), math.sqrt(3)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = [1 + 2 * sig(z0 - 1.5)] * 3 + [1 + 2 * sig(z3 - 1.5), 0.0]
    assert w[0].tolist() == pytest.approx(expected, rel=1e-5)


def test_constant_energy_flags_no_bottleneck():
    w = bottleneck_weights(torch.full((2, 3), 0.7), torch.ones(2, 3, dtype=torch.bool))
    assert torch.equal(w, torch.ones(2, 3))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 30))
def test_shuffled_weights_keep_the_multiset(seed, n):
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(2, n, generator=g)
    mask = torch.rand(2, n, generator=g) > 0.3
    out = shuffled_weights(weights, mask, torch.Generator().manual_seed(seed))
    assert torch.equal(out[~mask], weights[~mask])
    assert torch.equal(out[mask].sort().values, weights[mask].sort().values)


def test_shuffle_moves_weights():
    weights = torch.arange(100.0).reshape(1, 100)
    out = shuffled_weights(
        weights, torch.ones(1, 100, dtype=torch.bool), torch.Generator().manual_seed(0)
    )
    assert (out != weights).float().mean() > 0.9


def test_registries_and_inputs():
    assert {"advantage", "entropy", "surprisal", "free_energy"} <= set(ENERGY_SOURCES.names())
    assert {"none", "bottleneck"} <= set(WEIGHTINGS.names())
    with pytest.raises(KeyError, match="did you mean 'bottleneck'"):
        WEIGHTINGS.get("botleneck")
    from tokenergy.config import EnergyConfig

    inputs = EnergyInputs(mask=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="needs 'advantages'"):
        ENERGY_SOURCES.get("advantage")(inputs, EnergyConfig())

"""Token-level energies and weightings for LM agents: ActFocus (the paper's sigmoid form and
our softmax form) pinned on hand examples and their invariants, every energy source on hand-made inputs, no gradient into energies, the
learned sources learn, and the action-bottleneck diagnostic."""

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenergy.credit.diagnostics import role_reward_correlation
from tokenergy.credit.energy_models import Discriminator, UncertaintyEnsemble, window_ids
from tokenergy.energy import (
    TOKEN_ENERGIES,
    TOKEN_WEIGHTINGS,
    TokenEnergyInputs,
    actfocus_softmax_weights,
    actfocus_weights,
    energy_prior_kl,
    kl_full,
    ngram_repeat,
    shaped_rewards,
    shuffle_within_roles,
    top_fraction_weights,
)
from tokenergy.types import Role

OBS, R, A, F = (int(r) for r in (Role.OBSERVATION, Role.REASONING, Role.ACTION, Role.FORMAT))


def _mask(roles: torch.Tensor) -> torch.Tensor:
    return roles != OBS


# --------------------------------------------------------------------------- ActFocus


def test_actfocus_hand_example():
    roles = torch.tensor([[OBS, R, R, A, A, F]])
    energy = torch.tensor([[9.0, 5.0, -5.0, 0.0, 2.0, 7.0]])
    w = actfocus_weights(roles, energy, _mask(roles))  # the paper's alpha 0.1, beta 0.5
    # action energies (0, 2): mu = 1, sigma = sqrt(1 + 1e-6), z = -+1:
    # 1 + 0.5 * sigmoid(-1) = 1.134470..., 1 + 0.5 * sigmoid(1) = 1.365529...
    expected = torch.tensor([[0.0, 0.1, 0.1, 1.1344708, 1.3655292, 1.0]])
    assert torch.allclose(w, expected, atol=1e-6)


def test_actfocus_statistics_span_the_batch_and_skip_untrained_tokens():
    roles = torch.tensor([[OBS, A, R, A], [A, A, F, R]])
    energy = torch.tensor([[0.0, 0.0, 8.0, 3.0], [6.0, 100.0, 0.0, 1.0]])
    mask = _mask(roles) & torch.tensor([[True, True, True, True], [True, False, True, True]])
    w = actfocus_weights(roles, energy, mask, alpha=0.2, beta=0.5, format_weight=0.3)
    # trained action energies (0, 3, 6) across both rows; the masked 100 takes no part:
    # mu = 3, sigma = sqrt(6), z = (-1.2247, 0, 1.2247), sigmoid(1.2247) = 0.77290
    assert w[0, 1].item() == pytest.approx(1.113551, abs=1e-6)
    assert w[0, 3].item() == pytest.approx(1.25, abs=1e-6)
    assert w[1, 0].item() == pytest.approx(1.386449, abs=1e-6)
    assert w[1, 1].item() == 0.0 and w[0, 0].item() == 0.0
    assert w[0, 2].item() == pytest.approx(0.2) and w[1, 2].item() == pytest.approx(0.3)


def test_actfocus_one_action_token_gets_half_beta_and_none_leaves_ones():
    roles = torch.tensor([[R, A, F]])
    w = actfocus_weights(roles, torch.tensor([[1.0, 42.0, 0.0]]), _mask(roles), 0.1, 0.8)
    assert w[0, 1].item() == pytest.approx(1.4)  # z = 0: 1 + beta / 2
    roles = torch.tensor([[R, F, R]])
    w = actfocus_weights(roles, torch.tensor([[1.0, 2.0, 3.0]]), _mask(roles), 1.0, 0.8)
    assert torch.equal(w, torch.ones(1, 3))


def test_actfocus_alpha_one_beta_zero_is_uniform_ppo_exactly():
    from tokenergy.losses import ppo_policy_loss

    g = torch.Generator().manual_seed(3)
    roles = torch.randint(0, 4, (4, 9), generator=g)
    mask = (torch.rand(4, 9, generator=g) < 0.8) & (roles != OBS)
    energy = torch.randn(4, 9, generator=g)
    w = actfocus_weights(roles, energy, mask, alpha=1.0, beta=0.0)
    assert torch.equal(w, mask.float())
    logp = torch.randn(4, 9, generator=g) * 0.1 - 1.0
    old = logp + torch.randn(4, 9, generator=g) * 0.1
    adv = torch.randn(4, 9, generator=g)
    uniform, _ = ppo_policy_loss(logp, old, adv, mask, 0.2)
    for normalize in ("mask", "weights"):
        weighted, _ = ppo_policy_loss(logp, old, adv, mask, 0.2, weights=w, normalize=normalize)
        assert weighted.item() == uniform.item()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 12),
    st.floats(0.0, 1.0),
    st.floats(0.0, 3.0),
    st.floats(1e-3, 1e3),
    st.integers(0, 10_000),
)
def test_actfocus_invariants(b, t, alpha, beta, scale, seed):
    g = torch.Generator().manual_seed(seed)
    roles = torch.randint(0, 4, (b, t), generator=g)
    mask = torch.rand(b, t, generator=g) < 0.8
    energy = torch.randn(b, t, generator=g) * scale
    w = actfocus_weights(roles, energy, mask, alpha, beta)
    act = mask & (roles == A)
    assert (w[act] >= 1.0).all() and (w[act] <= 1.0 + beta + 1e-6).all()
    assert (w[~mask] == 0).all()
    reasoning = mask & (roles == R)
    assert torch.allclose(w[reasoning], torch.full_like(w[reasoning], alpha))
    # the weights read the energy only through its z-score: a shift changes nothing (made in
    # float64, so that the shift itself loses no digits of a small-scale energy)
    shifted = actfocus_weights(roles, energy.double() + 5.0, mask, alpha, beta)
    assert torch.allclose(shifted, w, atol=1e-5)
    # and the order of the action weights is the order of their energies
    if int(act.sum()) > 1:
        order = energy[act].argsort()
        assert (w[act][order].diff() >= -1e-6).all()


def test_actfocus_softmax_hand_example():
    roles = torch.tensor([[OBS, R, R, A, A, F]])
    energy = torch.tensor([[9.0, 5.0, -5.0, 0.0, math.log(3.0), 7.0]])
    w = actfocus_softmax_weights(roles, energy, _mask(roles), alpha=0.5, lam=0.5, tau=1.0)
    # s = softmax(0, ln 3) = (1/4, 3/4), N_a = 2: w = 1 + 0.5 * (2 s - 1)
    expected = torch.tensor([[0.0, 0.5, 0.5, 0.75, 1.25, 1.0]])
    assert torch.allclose(w, expected)


def test_actfocus_softmax_spans_the_whole_batch_and_respects_tau_and_format_weight():
    roles = torch.tensor([[OBS, A, R], [OBS, A, F]])
    energy = torch.tensor([[0.0, 0.0, 3.0], [0.0, 2.0, 0.0]])
    w = actfocus_softmax_weights(roles, energy, _mask(roles), 0.2, 1.0, tau=2.0, format_weight=0.0)
    # s over the batch's two action tokens: softmax(0/2, 2/2) = (1, e) / (1 + e)
    s1 = 1 / (1 + math.e)
    assert w[0, 1].item() == pytest.approx(2 * s1)
    assert w[1, 1].item() == pytest.approx(2 * (1 - s1))
    assert w[0, 2].item() == pytest.approx(0.2) and w[1, 2].item() == 0.0
    assert w[:, 0].abs().sum() == 0


def test_actfocus_softmax_high_tau_is_uniform_and_bad_tau_raises():
    roles = torch.tensor([[R, A, A, A]])
    w = actfocus_softmax_weights(
        roles, torch.tensor([[0.0, 1.0, 5.0, 9.0]]), _mask(roles), 0.3, 1.0, 1e6
    )
    assert torch.allclose(w, torch.tensor([[0.3, 1.0, 1.0, 1.0]]), atol=1e-4)
    with pytest.raises(ValueError, match="tau"):
        actfocus_softmax_weights(roles, torch.zeros(1, 4), _mask(roles), 0.3, 1.0, 0.0)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 12),
    st.floats(0.0, 1.0),
    st.floats(0.0, 2.0),
    st.floats(0.05, 5.0),
    st.integers(0, 10_000),
)
def test_actfocus_softmax_invariants(b, t, lam, alpha, tau, seed):
    g = torch.Generator().manual_seed(seed)
    roles = torch.randint(0, 4, (b, t), generator=g)
    mask = torch.rand(b, t, generator=g) < 0.8
    energy = torch.randn(b, t, generator=g) * 3
    w = actfocus_softmax_weights(roles, energy, mask, alpha, lam, tau)
    assert (w >= -1e-6).all()
    assert (w[~mask] == 0).all()
    act = mask & (roles == A)
    if act.any():
        assert w[act].mean().item() == pytest.approx(1.0, abs=1e-4)
    reasoning = mask & (roles == R)
    assert torch.allclose(w[reasoning], torch.full_like(w[reasoning], alpha))
    # lam = 0: reasoning down-weighting alone; alpha = 1: redistribution alone
    w0 = actfocus_softmax_weights(roles, energy, mask, alpha, 0.0, tau)
    assert torch.allclose(w0[act], torch.ones_like(w0[act]))
    w1 = actfocus_softmax_weights(roles, energy, mask, 1.0, lam, tau)
    assert torch.allclose(w1[reasoning], torch.ones_like(w1[reasoning]))
    assert torch.allclose(w1[act], w[act])


# --------------------------------------------------------------------------- other weightings


def test_top_fraction_keeps_the_highest_and_keeps_mean_one():
    energy = torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.7]])
    mask = torch.tensor([[True, True, True, True, False]])
    w = top_fraction_weights(energy, mask, rho=0.5)  # keep ceil(0.5 * 4) = 2 of 4
    assert torch.allclose(w, torch.tensor([[0.0, 2.0, 2.0, 0.0, 0.0]]))
    assert w[mask].mean().item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="rho"):
        top_fraction_weights(energy, mask, rho=0.0)


def test_shuffle_within_roles_keeps_each_roles_weights():
    g = torch.Generator().manual_seed(0)
    roles = torch.tensor([[OBS, R, A, R, A, A, F, R]] * 3)
    mask = _mask(roles)
    w = torch.rand(roles.shape, generator=g) * mask
    out = shuffle_within_roles(w, roles, mask, torch.Generator().manual_seed(1))
    for r in (R, A, F):
        m = mask & (roles == r)
        assert torch.equal(out[m].sort().values, w[m].sort().values)
    assert not torch.equal(out, w)
    assert (out[~mask] == w[~mask]).all()


def test_registered_weightings_read_the_config():
    roles = torch.tensor([[OBS, R, A, A]])
    energy = torch.tensor([[0.0, 0.0, 0.0, 10.0]])
    cfg = SimpleNamespace(
        alpha=0.5, beta=0.5, lam=1.0, tau=1.0, format_weight=1.0, threshold_std=0.5,
        weight_scale=3.0, smooth=False, top_rho=0.3,
    )  # fmt: skip
    m = _mask(roles)
    assert torch.equal(TOKEN_WEIGHTINGS.get("none")(energy, roles, m, cfg), m.float())
    af = TOKEN_WEIGHTINGS.get("actfocus")(energy, roles, m, cfg)
    # two action energies (0, 10): z = -+1, 1 + 0.5 * sigmoid(+-1)
    assert af[0, 1] == 0.5 and af[0, 2].item() == pytest.approx(1.134471, abs=1e-5)
    assert af[0, 3].item() == pytest.approx(1.365529, abs=1e-5)
    soft = TOKEN_WEIGHTINGS.get("actfocus_softmax")(energy, roles, m, cfg)
    assert soft[0, 1] == 0.5 and soft[0, 3] > 1.9
    bn = TOKEN_WEIGHTINGS.get("bottleneck")(energy, roles, m, cfg)
    assert torch.equal(bn, torch.tensor([[0.0, 1.0, 1.0, 3.0]]))
    top = TOKEN_WEIGHTINGS.get("top_entropy")(energy, roles, m, cfg)
    assert torch.equal(top, torch.tensor([[0.0, 0.0, 0.0, 3.0]]))


# --------------------------------------------------------------------------- energy uses


def test_shaped_rewards_hand_example():
    roles = torch.tensor([[OBS, A, A, R]])
    rewards = torch.tensor([[5.0, 0.0, 1.0, 0.0]])
    energy = torch.tensor([[100.0, 1.0, 3.0, 2.0]])
    out = shaped_rewards(rewards, energy, roles, _mask(roles), beta=0.5)
    # z over (1, 3, 2): mean 2, population std sqrt(2/3)
    z = torch.tensor([-1.0, 1.0, 0.0]) / math.sqrt(2 / 3)
    assert out[0, 0] == 5.0
    assert torch.allclose(out[0, 1:], rewards[0, 1:] - 0.5 * z, atol=1e-5)
    only_action = shaped_rewards(rewards, energy, roles, _mask(roles), 0.5, (Role.ACTION,))
    assert only_action[0, 3] == 0.0 and torch.allclose(
        only_action[0, 1:3], torch.tensor([0.5, 0.5])
    )


def test_energy_prior_kl_matches_torch_and_vanishes_at_the_prior():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g, requires_grad=True)
    ref = torch.randn(2, 3, 5, generator=g)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    e_vocab = -torch.log_softmax(ref, -1)
    loss = energy_prior_kl(logits, e_vocab, mask, tau=2.0)
    p = torch.distributions.Categorical(logits=logits)
    q = torch.distributions.Categorical(logits=torch.log_softmax(ref, -1) / 2.0)
    expected = torch.distributions.kl_divergence(p, q)[mask].mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    assert logits.grad is not None and logits.grad[~mask].abs().sum() == 0
    at_prior = energy_prior_kl(torch.log_softmax(ref, -1), e_vocab, mask, tau=1.0)
    assert at_prior.item() == pytest.approx(0.0, abs=1e-6)


# --------------------------------------------------------------------------- energy sources


def test_kl_full_hand_value():
    p = torch.log(torch.tensor([[[0.5, 0.5]]]))
    q = torch.log(torch.tensor([[[0.25, 0.75]]]))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl_full(p, q).item() == pytest.approx(expected)
    assert kl_full(p, p).item() == pytest.approx(0.0)


def test_ngram_repeat_hand_example():
    tokens = torch.tensor([[1, 2, 3, 1, 2, 3, 4]])
    mask = torch.tensor([[False, True, True, True, True, True, True]])
    assert ngram_repeat(tokens, mask, n=2).tolist() == [[0, 0, 0, 0, 1, 1, 0]]
    assert ngram_repeat(tokens, mask, n=3).tolist() == [[0, 0, 0, 0, 0, 1, 0]]
    assert ngram_repeat(tokens, mask, n=1).tolist() == [[0, 0, 0, 1, 1, 1, 0]]
    assert ngram_repeat(tokens[:, :2], mask[:, :2], n=3).sum() == 0


def test_every_token_energy_source_on_hand_inputs_and_without_gradient():
    roles = torch.tensor([[OBS, R, A, A]])
    grad = dict(requires_grad=True)
    inputs = TokenEnergyInputs(
        tokens=torch.tensor([[3, 4, 3, 4]]),
        roles=roles,
        mask=_mask(roles),
        logprobs=torch.tensor([[0.0, -1.0, -2.0, -0.5]], **grad),
        ref_logprobs=torch.tensor([[0.0, -0.5, -3.0, -0.1]], **grad),
        entropy=torch.tensor([[0.0, 0.2, 0.4, 0.6]], **grad),
        free_energy=torch.tensor([[0.0, -1.0, -2.0, -3.0]], **grad),
        kl_ref=torch.tensor([[0.0, 0.1, 0.2, 0.3]], **grad),
        ref_free_energy=torch.tensor([[0.0, -4.0, -5.0, -6.0]], **grad),
        ref_entropy=torch.tensor([[0.0, 1.5, 0.7, 0.2]], **grad),
        advantages=torch.tensor([[0.0, 0.0, 1.0, -1.0]], **grad),
    )
    cfg = SimpleNamespace(adv_beta=2.0, ngram=2)
    expected = {
        "ref_surprisal": [0.0, 0.5, 3.0, 0.1],
        "surprisal": [0.0, 1.0, 2.0, 0.5],
        "entropy": [0.0, 0.2, 0.4, 0.6],
        "free_energy": [0.0, -1.0, -2.0, -3.0],
        "kl_ref": [0.0, 0.1, 0.2, 0.3],
        "ref_free_energy": [0.0, -4.0, -5.0, -6.0],
        "ref_entropy": [0.0, 1.5, 0.7, 0.2],
        "logprob_shift": [0.0, -0.5, 1.0, -0.4],  # log pi_old - log pi_ref
        "ngram_repeat": [0.0, 0.0, 0.0, 1.0],  # (3, 4) again at the end
        "advantage": [0.5, 0.5, 1 / (1 + math.e**2), 1 / (1 + math.e**-2)],
    }
    for name, values in expected.items():
        e = TOKEN_ENERGIES.get(name)(inputs, cfg)
        assert e[0].tolist() == pytest.approx(values, abs=1e-6), name
        assert not e.requires_grad, name
    with pytest.raises(ValueError, match="ref_logprobs"):
        TOKEN_ENERGIES.get("ref_surprisal")(
            TokenEnergyInputs(tokens=inputs.tokens, roles=roles, mask=inputs.mask), cfg
        )


def test_discriminator_learns_to_tell_solver_tokens_from_agent_tokens():
    torch.manual_seed(0)
    solver = torch.tensor([[5, 6, 7, 8] * 4] * 8)
    agent = torch.tensor([[5, 6, 9, 9] * 4] * 8)
    mask = torch.ones_like(solver, dtype=torch.bool)
    d = Discriminator(vocab_size=12, window=2, steps=200, seed=0)
    d.update(solver, mask, agent, mask)
    assert d.last_accuracy > 0.7
    e_solver = d.energy(SimpleNamespace(tokens=solver, mask=mask))
    e_agent = d.energy(SimpleNamespace(tokens=agent, mask=mask))
    # the 9s are never written by the solver: high energy there, low on the solver's 7 and 8
    assert e_agent[:, 2::4].mean() > 2.0 > 0.5 > e_solver[:, 2::4].mean()
    assert not e_agent.requires_grad


def test_uncertainty_ensemble_disagrees_more_where_it_has_not_trained():
    # The env answers token 10 after action 3; the ensemble never sees action 4.
    roles = torch.tensor([[OBS, A, OBS, A, OBS]] * 6)
    seen = torch.tensor([[1, 3, 10, 3, 10]] * 6)
    mask = roles != OBS
    ens = UncertaintyEnsemble(vocab_size=12, heads=4, window=1, steps=200, seed=0)
    assert UncertaintyEnsemble.targets(roles, mask)[0].tolist() == [False, True, False, True, False]
    ens.update(seen, roles, mask)
    unseen = torch.tensor([[1, 4, 10, 4, 10]] * 6)
    e_seen = ens.energy(SimpleNamespace(tokens=seen, mask=mask))
    e_unseen = ens.energy(SimpleNamespace(tokens=unseen, mask=mask))
    assert e_unseen[:, 1].mean() > 5 * e_seen[:, 1].mean()
    assert (e_seen[~mask] == 0).all()


def test_window_ids():
    ids = window_ids(torch.tensor([[1, 2, 3]]), 2, pad_id=0)
    assert ids.tolist() == [[[0, 1], [1, 2], [2, 3]]]


# --------------------------------------------------------------------------- diagnostic


def test_role_reward_correlation_hand_example():
    # Two groups of 3 rollouts. Action log-prob sums track the return exactly; reasoning sums
    # are symmetric around their mean while returns are linear: correlation 0.
    roles = torch.tensor([[OBS, R, A]] * 6)
    mask = _mask(roles)
    logprobs = torch.tensor(
        [[0, -1, -3], [0, -2, -2], [0, -1, -1], [0, -5, -3], [0, -1, -2], [0, -5, -1]],
        dtype=torch.float32,
    )
    returns = torch.tensor([0.0, 1.0, 2.0, 0.0, 1.0, 2.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    out = role_reward_correlation(logprobs, roles, mask, returns, groups)
    assert out["corr_action"] == pytest.approx(1.0)
    assert out["corr_reasoning"] == pytest.approx(0.0, abs=1e-9)
    assert out["share_action"] == pytest.approx(0.5) and out["groups_action"] == 2
    # one token per role and episode: means equal sums
    assert out["corr_mean_action"] == pytest.approx(1.0)
    assert out["corr_mean_reasoning"] == pytest.approx(0.0, abs=1e-9)
    # a group with a constant return says nothing and is skipped
    flat = role_reward_correlation(logprobs, roles, mask, torch.zeros(6), groups)
    assert math.isnan(flat["corr_action"]) and flat["groups_action"] == 0


def test_score_keeps_the_per_token_quantities_the_sources_read():
    """entropy, free energy and the exact KL that ``score`` keeps equal the pure functions on
    the models' logits, shifted so position t describes the choice of token t."""
    from tokenergy.energy import entropy, free_energy
    from tokenergy.envs import make
    from tokenergy.models import build_agent
    from tokenergy.rollout import collate, rollout, score

    agent = build_agent("tiny", seed=0)
    ref = build_agent("tiny", seed=1).policy
    envs = [make("frozenlake") for _ in range(2)]
    eps = rollout(agent.policy, agent.tokenizer, envs, [0, 1], max_turns=2, max_turn_tokens=6,
                  generator=torch.Generator().manual_seed(0))  # fmt: skip
    traj = collate(eps, agent.tokenizer.pad_token_id)
    extras = frozenset({"free_energy", "kl_ref", "ref_free_energy", "ref_entropy"})
    sc = score(agent, ref, traj, extras=extras)
    with torch.no_grad():
        logits = agent(traj.tokens, traj.attention_mask).logits
        ref_logits = ref(input_ids=traj.tokens, attention_mask=traj.attention_mask).logits
    m = traj.mask
    assert torch.allclose(sc.entropy[:, 1:][m[:, 1:]], entropy(logits)[:, :-1][m[:, 1:]], atol=1e-5)
    assert torch.allclose(
        sc.free_energy[:, 1:][m[:, 1:]], free_energy(logits)[:, :-1][m[:, 1:]], atol=1e-5
    )
    assert torch.allclose(
        sc.kl_ref[:, 1:][m[:, 1:]], kl_full(logits, ref_logits)[:, :-1][m[:, 1:]], atol=1e-5
    )
    assert (sc.kl_ref[m] >= -1e-6).all()
    # the reference's free energy, from the reference pass the scoring already makes
    assert torch.allclose(
        sc.ref_free_energy[:, 1:][m[:, 1:]], free_energy(ref_logits)[:, :-1][m[:, 1:]], atol=1e-5
    )
    assert torch.allclose(
        sc.ref_entropy[:, 1:][m[:, 1:]], entropy(ref_logits)[:, :-1][m[:, 1:]], atol=1e-5
    )
    plain = score(agent, ref, traj)  # what PPO alone needs: no extra softmax over the vocabulary
    assert plain.kl_ref is None and plain.free_energy is None and plain.ref_free_energy is None
    assert plain.ref_entropy is None
    assert torch.equal(plain.logprobs, sc.logprobs) and torch.equal(plain.entropy, sc.entropy)
    assert score(agent, None, traj, extras=frozenset({"kl_ref"})).kl_ref is None
    assert score(agent, None, traj, extras=frozenset({"ref_free_energy"})).ref_free_energy is None


def test_mean_correlation_removes_the_length_effect():
    # Every action token has log-prob -1; episodes differ only in how many they wrote.
    roles = torch.tensor([[A, A, A]] * 3)
    mask = torch.tensor([[True, False, False], [True, True, False], [True, True, True]])
    out = role_reward_correlation(
        -torch.ones(3, 3), roles, mask, torch.tensor([3.0, 2.0, 1.0]), torch.zeros(3)
    )
    assert out["corr_action"] == pytest.approx(1.0)  # the sum only counts tokens
    assert math.isnan(out["corr_mean_action"])  # the mean is the same in every episode


# --------------------------------------------------------------------------- the paper's diagnostic


def _t_density(x: float, df: int) -> float:
    c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(c - (df + 1) / 2 * math.log1p(x * x / df))


@pytest.mark.parametrize(("t", "df"), [(1.0, 1), (1.0, 2), (2.3094, 3), (0.5, 7), (4.0, 30)])
def test_t_p_value_matches_closed_forms_and_the_integrated_density(t, df):
    from tokenergy.credit.diagnostics import t_two_sided_p

    # two-sided p = 2 * integral of the density from |t| to infinity; Simpson's rule on [0, t]
    n = 20_000
    h = t / n
    inner = sum(
        (1 if i in (0, n) else 4 if i % 2 else 2) * _t_density(i * h, df) for i in range(n + 1)
    )
    assert t_two_sided_p(t, df) == pytest.approx(1.0 - 2.0 * inner * h / 3, abs=1e-7)
    if df == 1:  # Cauchy: P(|T| > 1) = 1/2
        assert t_two_sided_p(t, df) == pytest.approx(0.5, abs=1e-12)
    if df == 2:  # P(|T| > t) = 1 - t / sqrt(2 + t^2)
        assert t_two_sided_p(t, df) == pytest.approx(1 - 1 / math.sqrt(3), abs=1e-12)
    assert t_two_sided_p(0.0, df) == pytest.approx(1.0)


def test_t_critical_closed_forms_and_the_interval_of_a_paired_mean():
    from tokenergy.credit.diagnostics import mean_interval, t_critical

    # df 1 is Cauchy: P(|T| > t) = 1 - 2 atan(t) / pi, so t = tan(pi / 2 * level)
    assert t_critical(1) == pytest.approx(math.tan(math.pi / 2 * 0.95), abs=1e-9)  # 12.706
    # df 2: P(|T| > t) = 1 - t / sqrt(2 + t^2), so t = sqrt(2 level^2 / (1 - level^2))
    assert t_critical(2) == pytest.approx(math.sqrt(2 * 0.95**2 / (1 - 0.95**2)), abs=1e-9)
    assert t_critical(2, level=0.5) == pytest.approx(math.sqrt(2 * 0.25 / 0.75), abs=1e-9)
    assert t_critical(10) == pytest.approx(2.2281, abs=1e-4)  # the printed tables
    assert 1.959 < t_critical(10_000) < 1.961  # tends to the normal's 1.96
    with pytest.raises(ValueError, match="level"):
        t_critical(3, level=1.0)
    # differences 10, 5, -5: mean 10/3, sd sqrt(175/3), half-width t_2 * sd / sqrt(3)
    mean, half = mean_interval([10.0, 5.0, -5.0])
    assert mean == pytest.approx(10 / 3)
    assert half == pytest.approx(4.302653 * math.sqrt(175 / 3) / math.sqrt(3), rel=1e-6)
    assert math.isnan(mean_interval([4.0])[1])


def test_spearman_hand_example_ties_and_degenerate_samples():
    from tokenergy.credit.diagnostics import spearman

    # ranks (1..5) against (2, 1, 4, 3, 5): sum d^2 = 4, rho = 1 - 6 * 4 / (5 * 24) = 0.8;
    # t = 0.8 * sqrt(3 / 0.36) = 2.3094 on 3 degrees of freedom: p = 0.1041
    rho, p = spearman(torch.tensor([1.0, 2, 3, 4, 5]), torch.tensor([2.0, 1, 4, 3, 5]))
    assert rho == pytest.approx(0.8) and p == pytest.approx(0.1041, abs=1e-4)
    # ties take their average rank: (1.5, 1.5, 3) against (1, 2, 3) -> rho = 0.8660
    rho, _ = spearman(torch.tensor([0.0, 0.0, 9.0]), torch.tensor([1.0, 2.0, 3.0]))
    assert rho == pytest.approx(math.sqrt(3) / 2)
    # a monotone transform changes nothing; a perfect order has p = 0
    x = torch.tensor([0.3, -1.0, 2.0, 5.0])
    assert spearman(x, x.exp()) == (pytest.approx(1.0), 0.0)
    assert all(math.isnan(v) for v in spearman(torch.ones(4), x))
    assert all(math.isnan(v) for v in spearman(x[:2], x[:2]))


def test_energy_reward_std_correlation_hand_example():
    from tokenergy.credit.diagnostics import energy_reward_std_correlation

    # 4 groups of 2 episodes; the groups' return stds are 0, 0.5, 1, 2 (population)
    returns = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 2.0, 0.0, 4.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    roles = torch.tensor([[OBS, R, A, A]] * 8)
    mask = _mask(roles)
    # per group, action energy rises with the std (group means 1, 2, 3, 4), reasoning energy
    # falls (means 9, 7, 5, 3); the untrained observation token is ignored
    act = torch.tensor([1.0, 1, 2, 2, 3, 3, 4, 4])
    rea = torch.tensor([9.0, 9, 7, 7, 5, 5, 3, 3])
    energy = torch.stack([torch.full((8,), 100.0), rea, act, act], dim=1)
    energy[1, 2] = 0.0  # group 0's action mean (0 + 1 + 1 + 1) / 4 = 0.75: the order holds
    out = energy_reward_std_correlation(energy, roles, mask, returns, groups)
    assert out["energy_groups"] == 4 and out["reward_std_mean"] == pytest.approx(0.875)
    assert out["energy_spearman_action"] == pytest.approx(1.0) and out["energy_p_action"] == 0.0
    assert out["energy_spearman_reasoning"] == pytest.approx(-1.0)
    # all trained tokens: group means 21/6 = 3.5 (group 0), then 11/3 three times; ranks
    # (1, 3, 3, 3) against (1, 2, 3, 4): rho = 3 / sqrt(3 * 5)
    assert out["energy_spearman_all"] == pytest.approx(3 / math.sqrt(15))
    # returns that do not vary within any group: no std to rank
    flat = energy_reward_std_correlation(energy, roles, mask, torch.zeros(8), groups)
    assert math.isnan(flat["energy_spearman_action"]) and flat["reward_std_mean"] == 0.0

"""The safety envelope and the rest of the robustness kit of the LM trainer: reward whitening
with a clip, the ratio cap, the adaptive KL controller, bf16, the target value head, the SFT
anchor and the curiosity bonus."""

import copy
import math

import pytest
import torch

from tokenergy.algos import lm
from tokenergy.algos.lm import train_lm
from tokenergy.config import ConfigError
from tokenergy.credit.energy_models import NextObservationModel
from tokenergy.models import build_agent
from tokenergy.runs import Run, load_trainer_state
from tokenergy.safety import (
    AdaptiveKL,
    autocast,
    clip_whiten_rewards,
    params_are_finite,
    turn_ends,
)
from tokenergy.types import Role


def cfg_of(**over):
    from test_lm import tiny_cfg

    return tiny_cfg(**over)


# --------------------------------------------------------------------------- pure parts


def test_turn_ends_mark_the_last_token_of_each_agent_run():
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [0, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    ends = turn_ends(mask)
    assert ends.nonzero().tolist() == [[0, 2], [0, 5], [1, 6]]


def test_reward_whitening_clips_outliers_and_keeps_zero_at_zero():
    # 20 turn ends: nineteen rewards of 1 and one of 100; two non-turn positions
    r = torch.tensor([[1.0] * 19 + [100.0, 7.0, 7.0]])
    where = torch.tensor([[True] * 20 + [False, False]])
    mean = (19 + 100) / 20
    std = math.sqrt((19 * 1 + 100**2) / 20 - mean**2)
    out, frac = clip_whiten_rewards(r, where, clip=3.0)
    hi = mean + 3 * std
    assert hi < 100  # the outlier lies beyond 3 sigma
    assert out[0, 19].item() == pytest.approx(hi / std, rel=1e-5)
    assert out[0, 0].item() == pytest.approx(1 / std, rel=1e-5)
    assert out[0, 20:].tolist() == [7.0, 7.0]  # outside `where`: untouched
    assert frac == pytest.approx(1 / 20)
    zero, _ = clip_whiten_rewards(torch.tensor([[0.0, 2.0, 4.0]]), torch.ones(1, 3, dtype=bool))
    assert zero[0, 0].item() == 0.0  # no mean shift: a turn that earned nothing earns nothing


def test_adaptive_kl_moves_toward_its_target_by_at_most_20_percent_per_horizon():
    ctl = AdaptiveKL(init=0.1, target=0.02, horizon=100)
    assert ctl.update(0.04, n=100) == pytest.approx(0.1 * 1.2)  # KL 2x target: +20% (clipped)
    assert ctl.update(0.021, n=50) == pytest.approx(0.12 * (1 + 0.05 * 0.5))
    assert ctl.update(0.0, n=100) == pytest.approx(0.123 * 0.8)  # far below: -20%
    before = ctl.value
    assert ctl.update(float("nan"), n=100) == before  # a NaN KL leaves it alone
    with pytest.raises(ValueError):
        AdaptiveKL(0.0, 0.02, 100)


def test_next_observation_model_bonus_is_the_mean_nll_of_the_reply_after_each_turn():
    obs, act = int(Role.OBSERVATION), int(Role.ACTION)
    #            bos  o   o   a   a   o   o   o   a   a   (pad)
    tokens = torch.tensor([[0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 1]])
    roles = torch.tensor([[obs, obs, obs, act, act, obs, obs, obs, act, act, obs]])
    mask = roles == act
    attn = torch.ones_like(mask)
    attn[0, -1] = False
    model = NextObservationModel(vocab_size=16, window=2, seed=0)
    bonus = model.bonus(tokens, roles, mask, attn)
    with torch.no_grad():
        logp = torch.log_softmax(model.net(tokens), -1)[0]
    # turn 1 ends at 4; its reply is tokens 5, 6, 7 (predicted at positions 4, 5, 6)
    want = -(logp[4, 9] + logp[5, 10] + logp[6, 11]) / 3
    assert bonus[0, 4].item() == pytest.approx(want.item(), rel=1e-5)
    # the last turn (ends at 9) has no reply: the padding after it is not the env's text
    assert bonus[0, 9].item() == 0.0
    assert (bonus[0, [i for i in range(11) if i != 4]] == 0).all()
    for _ in range(5):
        model.update(tokens, roles, mask, attn)
    assert (
        model.bonus(tokens, roles, mask, attn)[0, 4] < bonus[0, 4] / 2
    )  # a familiar reply pays less


def test_envelope_config_errors():
    with pytest.raises(ConfigError, match="precision"):
        cfg_of(**{"algo.precision": "fp16"})
    with pytest.raises(ConfigError, match="kl_target"):
        cfg_of(**{"algo.kl_target": 0.01, "algo.kl_coef": 0.0})
    with pytest.raises(ConfigError, match="ratio_cap"):
        cfg_of(**{"algo.ratio_cap": 0.5})
    with pytest.raises(ConfigError, match="value_target_tau"):
        cfg_of(**{"algo.name": "grpo", "rollout.group_size": 2, "algo.value_target_tau": 0.1})


# --------------------------------------------------------------------------- in a run


def test_a_huge_ratio_skips_the_step_and_leaves_the_weights(monkeypatch):
    real_score = lm.score

    def shifted_score(*args, **kwargs):  # old log-probs 10 nats too low: ratio ~ e^10
        sc = real_score(*args, **kwargs)
        sc.logprobs = sc.logprobs - 10.0
        return sc

    monkeypatch.setattr(lm, "score", shifted_score)
    agent = build_agent("tiny", seed=0)
    before = copy.deepcopy(agent.state_dict())
    cfg = cfg_of(**{"algo.iterations": 2})
    result = train_lm(cfg, agent=agent)
    n_steps = cfg.algo.epochs * cfg.algo.minibatches
    assert [r["envelope/ratio_skips"] for r in result.history] == [n_steps, 2 * n_steps]
    assert [r["train/updates"] for r in result.history] == [0, 0]
    assert all(torch.equal(before[k], v) for k, v in agent.state_dict().items())

    monkeypatch.setattr(lm, "score", real_score)  # the cap off: the same batch trains
    agent = build_agent("tiny", seed=0)
    monkeypatch.setattr(lm, "score", shifted_score)
    result = train_lm(cfg_of(**{"algo.iterations": 1, "algo.ratio_cap": None}), agent=agent)
    assert result.history[0]["train/updates"] == n_steps
    assert not all(torch.equal(before[k], v) for k, v in agent.state_dict().items())


def test_adaptive_kl_raises_the_coefficient_while_the_policy_drifts():
    cfg = cfg_of(
        **{"algo.iterations": 3, "algo.kl_coef": 0.05, "algo.kl_target": 1e-6, "algo.kl_horizon": 4}
    )
    rows = train_lm(cfg).history
    coefs = [r["train/kl_coef"] for r in rows]
    # before the first update the policy is the reference (KL 0): the coefficient falls 20%
    # once, then every drifted batch (KL >> target) raises it 20% per 4 episodes, capped
    assert rows[0]["kl/ref"] == pytest.approx(0.0, abs=1e-6)
    assert coefs[0] == pytest.approx(0.05)
    assert coefs[1] == pytest.approx(0.05 * (1 - 0.2 * 4 / 4))  # n/horizon = 1: -20%
    assert rows[1]["kl/ref"] > 1e-4
    assert coefs[2] == pytest.approx(coefs[1] * 1.2)


def test_bf16_trains_finite_and_scores_close_to_fp32():
    agent = build_agent("tiny", seed=0)
    cfg = cfg_of(**{"algo.precision": "bf16", "algo.iterations": 2})
    before = copy.deepcopy(agent.state_dict())
    rows = train_lm(cfg, agent=agent).history
    assert params_are_finite(agent) and all(math.isfinite(r["loss/policy"]) for r in rows)
    assert rows[-1]["train/updates"] > 0
    assert any(not torch.equal(before[k], v) for k, v in agent.state_dict().items())
    # bf16 log-probs: close to fp32, not equal (the autocast is really on)
    ids = torch.randint(5, len(agent.tokenizer), (2, 24))
    attn = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        full = lm.token_logprobs(agent(ids, attn).logits, ids)
        with autocast(torch.device("cpu"), "bf16"):
            half = lm.token_logprobs(agent(ids, attn).logits, ids)
    diff = (full - half).abs().max().item()
    assert 0 < diff < 0.1


def test_target_value_head_is_a_soft_copy_of_the_value_head(tmp_path):
    tau = 0.25
    agent = build_agent("tiny", seed=0)
    head0 = copy.deepcopy(agent.value_head.state_dict())
    cfg = cfg_of(**{"algo.value_target_tau": tau, "algo.iterations": 1})
    with Run(tmp_path / "run", cfg) as run:
        train_lm(cfg, run=run, agent=agent)
    ckpt = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    target = load_trainer_state(ckpt)["envelope"]["target_head"]
    head1 = agent.value_head.state_dict()
    for k in head0:
        want = (1 - tau) * head0[k] + tau * head1[k]
        assert torch.allclose(target[k], want, atol=1e-6), k
    assert any(not torch.equal(head0[k], head1[k]) for k in head0)  # the head did move


def test_sft_anchor_pulls_the_policy_toward_the_demonstrations():
    # No SFT: the anchor alone teaches the format while RL has almost no signal.
    common = {"algo.iterations": 4, "algo.lr": 3e-3, "sft.episodes": 16}
    rows = train_lm(cfg_of(**common, **{"algo.sft_coef": 1.0, "algo.sft_coef_final": 0.5})).history
    nll = [r["loss/sft_anchor"] for r in rows]
    assert nll[-1] < 0.7 * nll[0]
    assert [r["train/sft_coef"] for r in rows] == pytest.approx(
        [1.0, 5 / 6, 4 / 6, 0.5]
    )  # final at the last
    plain = train_lm(cfg_of(**common)).history
    assert "loss/sft_anchor" not in plain[0]


def test_curiosity_bonus_is_paid_and_fades_as_replies_become_familiar():
    rows = train_lm(cfg_of(**{"algo.iterations": 4, "rollout.curiosity_coef": 0.1})).history
    bonus = [r["rollout/curiosity"] for r in rows]
    assert bonus[0] > 0
    assert bonus[-1] < bonus[0]
    assert all(math.isfinite(r["loss/next_obs"]) for r in rows)

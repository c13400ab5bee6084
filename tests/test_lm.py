"""Language-model agents: tokenizer, models, save / load, rollouts, token-level GAE, gradient
boundaries and the SFT / PPO / GRPO / REINFORCE trainer on tiny models."""

import json
import math

import pytest
import torch

from tokenergy.advantages import gae, token_gae
from tokenergy.algos.lm import sft, train_lm
from tokenergy.config import ConfigError, config_from_dict
from tokenergy.envs import make
from tokenergy.losses import ppo_policy_loss
from tokenergy.models import ModelLoadError, build_agent, build_tokenizer, load_agent, save_agent
from tokenergy.rollout import (
    assign_roles,
    collate,
    generate_turns,
    rollout,
    tag_ids_of,
    token_logprobs,
)
from tokenergy.types import Role

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def tiny_cfg(**over):
    data = {
        "kind": "lm",
        "env": {"name": "frozenlake", "max_turns": 3},
        "model": {"size": "tiny"},
        "sft": {"episodes": 0},
        "rollout": {"episodes": 4, "max_turn_tokens": 12},
        "algo": {"name": "ppo", "iterations": 1, "minibatches": 2, "lr": 1e-2},
        "eval": {"episodes": 4, "every": 1},
        "log": {"tensorboard": False, "progress": False},
    }
    for dotted, value in over.items():
        sec, key = dotted.split(".")
        data.setdefault(sec, {})[key] = value
    return config_from_dict(data)


# --------------------------------------------------------------------------- tokenizer, models


def test_tokenizer_covers_every_env_text(tok):
    unk = tok.unk_token_id
    for name in ("frozenlake", "sokoban", "sudoku4", "treasure", "tree_search"):
        env = make(name)
        env.reset(seed=1)
        for _ in range(3):
            ids = tok(env.render() + "\n" + env.solver_turn(), add_special_tokens=False).input_ids
            assert unk not in ids, tok.convert_ids_to_tokens(ids)
            env.step(env.solver_turn())
    ids = tok("<answer>Up</answer>", add_special_tokens=False).input_ids
    assert tok.convert_ids_to_tokens(ids) == ["<answer>", "Up", "</answer>"]
    assert build_tokenizer().get_vocab() == tok.get_vocab()  # deterministic ids


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_save_load_gives_identical_logits_and_values(tmp_path, tok, arch):
    agent = build_agent("tiny", arch, tokenizer=tok, seed=3)
    torch.nn.init.normal_(agent.value_head.net[2].weight)  # make the head non-trivial
    x = torch.tensor([tok("<bos> P F ⏎ <think> i </think>").input_ids])
    before = agent(x)
    save_agent(agent, tmp_path / "a")
    loaded = load_agent(tmp_path / "a")
    after = loaded(x)
    assert torch.equal(before.logits, after.logits) and torch.equal(before.values, after.values)
    assert loaded.tokenizer.get_vocab() == tok.get_vocab()


def test_separate_critic_starts_equal_saves_and_never_reaches_the_policy(tmp_path, tok):
    from tokenergy.config import LMModelConfig
    from tokenergy.models.lm import CriticModel, agent_from_config, separate_critic

    agent = build_agent("tiny", tokenizer=tok, seed=3)
    torch.nn.init.normal_(agent.value_head.net[2].weight)
    x = torch.tensor([tok("<bos> P F ⏎ <think> i </think> <answer> Up </answer>").input_ids])
    before = agent(x)
    separate_critic(agent)
    assert isinstance(agent.value_head, CriticModel)
    assert separate_critic(agent).value_head is agent.value_head  # a no-op the second time
    after = agent(x)
    # the critic's transformer is a copy of the policy's: same features, same head, same values
    assert torch.equal(before.logits, after.logits)
    torch.testing.assert_close(after.values, before.values, rtol=1e-5, atol=1e-6)
    # the value loss trains the critic and never the policy; the critic's weights are its own
    after.values.square().sum().backward()
    assert all(p.grad is None for p in agent.policy.parameters())
    trunk_grads = [p.grad for p in agent.value_head.trunk.parameters()]
    assert all(g is not None for g in trunk_grads) and any(g.abs().sum() > 0 for g in trunk_grads)
    shared = {p.data_ptr() for p in agent.policy.parameters()}
    assert not shared & {p.data_ptr() for p in agent.value_head.parameters()}
    with torch.no_grad():  # the critic moves; the policy's logits do not
        for p in agent.value_head.trunk.parameters():
            p.add_(0.01 * torch.randn_like(p))
    moved = agent(x)
    assert torch.equal(moved.logits, before.logits) and not torch.equal(moved.values, after.values)
    save_agent(agent, tmp_path / "a")
    loaded = load_agent(tmp_path / "a")
    assert isinstance(loaded.value_head, CriticModel)
    again = loaded(x)
    assert torch.equal(again.logits, moved.logits) and torch.equal(again.values, moved.values)
    # a run's config decides: `critic: shared` drops a loaded critic's transformer
    for critic, kind in (("separate", CriticModel), ("shared", type(loaded.value_head.head))):
        cfg = LMModelConfig(path=str(tmp_path / "a"), critic=critic)
        assert type(agent_from_config(cfg).value_head) is kind
    # saving a shared-critic agent over the folder removes the old critic
    save_agent(build_agent("tiny", tokenizer=tok, seed=4), tmp_path / "a")
    assert not (tmp_path / "a" / "critic").exists()
    assert not isinstance(load_agent(tmp_path / "a").value_head, CriticModel)


def test_named_sizes_and_zero_value_at_init(tok):
    counts = {
        s: sum(p.numel() for p in build_agent(s, tokenizer=tok).parameters())
        for s in ("tiny", "small")
    }
    assert 5e4 < counts["tiny"] < 2e5 and 5e5 < counts["small"] < 1.5e6
    agent = build_agent("tiny", tokenizer=tok)
    assert agent(torch.tensor([[1, 2, 3]])).values.abs().max() == 0


def test_loads_a_users_plain_causal_lm_folder(tmp_path, tok):
    agent = build_agent("tiny", tokenizer=tok, seed=1)
    agent.policy.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    loaded = load_agent(tmp_path / "hf")
    x = torch.tensor([[1, 5, 9, 12]])
    assert torch.equal(loaded(x).logits, agent(x).logits)
    assert loaded(x).values.abs().max() == 0  # a fresh value head


def test_bad_model_folders_name_the_path(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_agent(tmp_path / "nowhere")
    (tmp_path / "enc").mkdir()
    (tmp_path / "enc" / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(ModelLoadError, match=r"enc.*not a causal language model"):
        load_agent(tmp_path / "enc")


# --------------------------------------------------------------------------- roles, rollouts


def test_assign_roles_by_hand(tok):
    text = "<think> plan : Up </think> <answer> Up </answer>"
    ids = tok(text, add_special_tokens=False).input_ids
    roles = assign_roles(ids, tag_ids_of(tok))
    R, A, F = int(Role.REASONING), int(Role.ACTION), int(Role.FORMAT)
    assert roles == [F, R, R, R, F, F, A, F]
    stray = tok("Up <answer> Down Left", add_special_tokens=False).input_ids
    assert assign_roles(stray, tag_ids_of(tok)) == [R, F, A, A]


def test_solver_rollout_layout(tok):
    envs = [make("sokoban") for _ in range(3)]
    agent = build_agent("tiny", tokenizer=tok)
    eps = rollout(
        agent.policy, tok, envs, [0, 1, 2], max_turns=12, turn_fn=lambda e: e.solver_turn()
    )
    traj = collate(eps, tok.pad_token_id)
    close = tok.convert_tokens_to_ids("</answer>")
    for i, ep in enumerate(eps):
        assert ep.success and ep.terminated and not ep.truncated
        n = int(traj.last_index[i]) + 1
        assert traj.tokens[i, 0] == tok.bos_token_id and not traj.mask[i, 0]
        # every turn's reward sits on its closing tag, and they add up to the return
        reward_pos = traj.rewards[i].nonzero().squeeze(-1)
        assert (traj.tokens[i, reward_pos] == close).all()
        assert float(traj.rewards[i].sum()) == pytest.approx(ep.episode_return, abs=1e-5)
        assert len(reward_pos) == ep.turns
        # observation tokens and padding are never trained; agent tokens always are
        obs = traj.roles[i] == int(Role.OBSERVATION)
        assert not (traj.mask[i] & obs).any()
        assert (traj.mask[i, 1:n] == ~obs[1:n]).all() and not traj.mask[i, n:].any()
        # the episode ends with the final observation (for bootstrapping)
        assert traj.roles[i, n - 1] == int(Role.OBSERVATION)
    # reasoning spans are several times longer than action spans
    roles = traj.roles[traj.mask]
    assert (roles == int(Role.REASONING)).sum() > 5 * (roles == int(Role.ACTION)).sum()


def test_solver_agreement_counts_turns_that_play_the_solvers_move(tok):
    from tokenergy.rollout.episodes import episode_stats

    env = make("frozenlake", desc=["SFF", "FHF", "FFG"])
    env.reset(seed=0)
    best = env.solver_action()  # Down or Right: both are shortest; the solver picks one
    other = "Right" if best == "Down" else "Down"
    assert env.follows_solver(f"<think> x </think> <answer> {best.lower()} </answer>")
    assert not env.follows_solver(f"<answer> {other} </answer>")
    assert not env.follows_solver("<answer> Jump </answer>") and not env.follows_solver("")

    agent = build_agent("tiny", tokenizer=tok)
    envs = [make("frozenlake", desc=["SFF", "FHF", "FFG"]) for _ in range(2)]
    eps = rollout(agent.policy, tok, envs, [0, 1], max_turns=6, count_solver_moves=True,
                  turn_fn=lambda e: e.solver_turn())  # fmt: skip
    assert [e.solver_moves for e in eps] == [e.turns for e in eps] == [4, 4]
    # the second episode plays one wrong move first (Up bumps the wall), then the solver's
    moves = iter(["<answer> Up </answer>"])
    eps[1:] = rollout(agent.policy, tok, envs[1:], [1], max_turns=6, count_solver_moves=True,
                      turn_fn=lambda e: next(moves, None) or e.solver_turn())  # fmt: skip
    assert (eps[1].turns, eps[1].solver_moves) == (5, 4)
    stats = episode_stats(collate(eps, tok.pad_token_id), "eval")
    assert stats["eval/solver_agreement"] == pytest.approx(8 / 9)
    # not counted: no metric
    eps = rollout(agent.policy, tok, envs, [0, 1], max_turns=2, turn_fn=lambda e: e.solver_turn())
    assert "eval/solver_agreement" not in episode_stats(collate(eps, tok.pad_token_id), "eval")


def test_batched_cached_generation_equals_one_by_one(tok):
    agent = build_agent("tiny", tokenizer=tok, seed=5)
    contexts = [[1, 20, 21, 22, 23, 24, 25], [1, 30, 31], [1, 40, 41, 42, 43]]
    stop = {tok.convert_tokens_to_ids("</answer>")}
    batched = generate_turns(agent.policy, contexts, stop, tok.pad_token_id, 10, 0.0, 1.0, None)
    for ctx, got in zip(contexts, batched, strict=True):
        seq = list(ctx)
        want = []
        for _ in range(len(got)):  # greedy, whole-sequence forward, no cache, no padding
            nxt = int(agent.policy(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            want.append(nxt)
            seq.append(nxt)
        assert got == want


def test_random_policy_rollout_never_crashes_and_respects_budgets(tok):
    agent = build_agent("tiny", tokenizer=tok, seed=0)
    envs = [make("sudoku4") for _ in range(6)]
    eps = rollout(
        agent.policy,
        tok,
        envs,
        list(range(6)),
        max_turns=3,
        max_turn_tokens=8,
        generator=torch.Generator().manual_seed(0),
    )
    for ep in eps:
        assert 1 <= ep.turns <= 3 and ep.terminated != ep.truncated
        assert all(len(t.split()) <= 8 for t in ep.turn_texts)


# --------------------------------------------------------------------------- token GAE


def test_token_gae_without_gaps_is_gae():
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)
    mask = torch.ones(3, 6, dtype=torch.bool)
    term = torch.tensor([True, False, True])
    boot = torch.randn(3, generator=g)
    adv, ret = token_gae(r, v, mask, term, boot, 0.9, 0.8)
    nv = torch.cat([v[:, 1:], boot[:, None]], 1)
    ends = torch.zeros(3, 6, dtype=torch.bool)
    ends[:, -1] = True
    t = torch.zeros(3, 6, dtype=torch.bool)
    t[:, -1] = term
    want, want_ret = gae(r, v, nv, t, ends, 0.9, 0.8)
    assert torch.allclose(adv, want) and torch.allclose(ret, want_ret)


def test_token_gae_skips_observation_tokens_by_hand():
    # tokens: [obs, a0, a1, obs, obs, a2]; reward 1 on a1, 2 on a2; terminated.
    mask = torch.tensor([[False, True, True, False, False, True]])
    r = torch.tensor([[0.0, 0.0, 1.0, 5.0, 5.0, 2.0]])  # rewards on obs tokens are ignored
    v = torch.tensor([[9.0, 0.5, 0.25, 9.0, 9.0, 1.0]])
    adv, ret = token_gae(r, v, mask, torch.tensor([True]), torch.tensor([7.0]), 1.0, 1.0)
    # lambda = 1, gamma = 1: A_t = (sum of rewards from t) - V_t over the agent tokens
    assert adv.tolist() == [[0.0, 3.0 - 0.5, 3.0 - 0.25, 0.0, 0.0, 2.0 - 1.0]]
    assert ret.tolist() == [[0.0, 3.0, 3.0, 0.0, 0.0, 2.0]]
    # truncated: bootstrap from the value after the final observation
    adv_t, _ = token_gae(r, v, mask, torch.tensor([False]), torch.tensor([7.0]), 1.0, 1.0)
    assert adv_t[0, 5] == pytest.approx(2.0 + 7.0 - 1.0)


# --------------------------------------------------------------------------- gradients, updates


def test_observation_tokens_get_exactly_zero_gradient(tok):
    agent = build_agent("tiny", tokenizer=tok, seed=0)
    eps = rollout(
        agent.policy,
        tok,
        [make("frozenlake") for _ in range(2)],
        [0, 1],
        max_turns=2,
        turn_fn=lambda e: e.solver_turn(),
    )
    traj = collate(eps, tok.pad_token_id)
    out = agent(traj.tokens, traj.attention_mask)
    out.logits.retain_grad()
    logp = token_logprobs(out.logits, traj.tokens)
    adv = torch.randn(traj.tokens.shape)
    loss, _ = ppo_policy_loss(logp, logp.detach(), adv, traj.mask, 0.2)
    loss.backward()
    # logits[:, t] predict token t + 1: positions predicting observation (or pad) tokens
    predicts_untrained = ~traj.mask[:, 1:]
    g = out.logits.grad[:, :-1]
    assert g[predicts_untrained].abs().max() == 0
    assert g[~predicts_untrained].abs().sum() > 0


@pytest.mark.parametrize("algo", ["ppo", "grpo", "reinforce"])
def test_one_update_changes_parameters_and_logs(tmp_path, algo):
    from tokenergy.runs import Run

    # A random policy writes only invalid turns, so every episode earns the same return and
    # GRPO / REINFORCE advantages are all 0: the entropy bonus makes the update non-trivial.
    cfg = tiny_cfg(
        **{
            "algo.name": algo,
            "rollout.group_size": 2 if algo == "grpo" else 1,
            "algo.ent_coef": 0.01,
        }
    )
    agent = build_agent("tiny", seed=0)
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    with Run(tmp_path / algo, cfg) as run:
        result = train_lm(cfg, run, agent=agent)
    changed = {k for k, v in agent.state_dict().items() if not torch.equal(v, before[k])}
    assert any(k.startswith("policy.") for k in changed)
    assert any(k.startswith("value_head.") for k in changed) == (algo == "ppo")
    rows = [json.loads(x) for x in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["train/iteration"] == 0 and "eval/success" in rows[0]
    assert rows[-1]["train/iteration"] == 1 and "loss/policy" in rows[-1]
    sample = json.loads((tmp_path / algo / "samples.jsonl").read_text().splitlines()[0])
    assert len(sample["tokens"]) == len(sample["roles"]) == len(sample["advantage"])
    assert (tmp_path / algo / "agent" / "policy" / "config.json").is_file()
    assert result.history[-1]["train/episodes"] == 4


def test_ppo_with_a_separate_critic_trains_the_critic_and_saves_it(tmp_path):
    from tokenergy.models.lm import CriticModel
    from tokenergy.runs import Run

    cfg = tiny_cfg(**{"model.critic": "separate", "algo.ent_coef": 0.01, "algo.iterations": 2})
    agent = build_agent("tiny", seed=0)
    start = {k: v.clone() for k, v in agent.policy.base_model.state_dict().items()}
    with Run(tmp_path / "run", cfg) as run:
        train_lm(cfg, run, agent=agent)
    assert isinstance(agent.value_head, CriticModel)
    critic = agent.value_head.trunk.state_dict()
    assert start.keys() == critic.keys()  # the critic is a copy of the policy's transformer ...
    assert any(not torch.equal(start[k], critic[k]) for k in start)  # ... trained on its own
    policy = agent.policy.base_model.state_dict()
    assert any(not torch.equal(policy[k], critic[k]) for k in start)
    assert (tmp_path / "run" / "agent" / "critic" / "config.json").is_file()
    assert isinstance(load_agent(tmp_path / "run" / "agent").value_head, CriticModel)


def _hand_batch():
    """Two groups of two episodes; rewards on the last agent token of each turn."""
    from tokenergy.rollout import Scored, Trajectories

    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 1, 1, 0, 1], [0, 1, 1, 0, 1], [0, 1, 1, 0, 1]]).bool()
    rewards = torch.zeros(4, 5)
    rewards[:, 2] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    rewards[:, 4] = torch.tensor([1.0, 1.0, 0.0, 2.0])
    z = torch.zeros(4, 5)
    traj = Trajectories(
        tokens=z.long(),
        roles=z.long(),
        attention_mask=torch.ones(4, 5, dtype=torch.bool),
        mask=mask,
        rewards=rewards,
        terminated=torch.ones(4, dtype=torch.bool),
        truncated=torch.zeros(4, dtype=torch.bool),
        last_index=torch.full((4,), 4),
        episode_return=rewards.sum(1),
        success=torch.zeros(4, dtype=torch.bool),
        turns=torch.full((4,), 2),
        invalid_turns=torch.zeros(4, dtype=torch.long),
        groups=torch.tensor([0, 0, 1, 1]),
        episodes=[],
    )
    sc = Scored(logprobs=z, ref_logprobs=z, values=z, bootstrap=torch.zeros(4), entropy=z)
    return traj, sc


def test_grpo_and_reinforce_advantages_by_hand():
    from tokenergy.advantages import ALGORITHMS

    traj, sc = _hand_batch()
    cfg = tiny_cfg().algo
    grpo = ALGORITHMS.get("grpo")(traj, sc, traj.rewards, cfg).advantages
    # returns 2, 1 | 0, 2: each group's two members sit at -/+ 1/sqrt(2) (unbiased std)
    s = 2**-0.5
    expected = torch.tensor([s, -s, -s, s])
    assert torch.allclose(grpo[:, 1], expected, atol=1e-5) and (grpo[:, 0] == 0).all()
    assert torch.allclose(grpo[:, 4], expected, atol=1e-5) and (grpo[:, 3] == 0).all()
    rf = ALGORITHMS.get("reinforce")(traj, sc, traj.rewards, cfg).advantages
    # return-to-go minus the batch mean return (1.25), gamma = 1
    assert rf[:, 1].tolist() == pytest.approx([0.75, -0.25, -1.25, 0.75])
    assert rf[:, 4].tolist() == pytest.approx([-0.25, -0.25, -1.25, 0.75])


def test_ppo_truncation_terminal_drops_the_bootstrap_of_a_cut_off_episode():
    """PPO's returns with gamma = lambda = 1 on the hand batch: each trained token's reward
    to go, plus, for an episode the turn limit cut off, the critic's value of the last
    observation (bootstrap), or nothing (terminal: the limit is part of the task)."""
    import dataclasses

    from tokenergy.advantages import ALGORITHMS

    traj, sc = _hand_batch()
    traj = dataclasses.replace(
        traj,
        terminated=torch.tensor([True, False, False, True]),
        truncated=torch.tensor([False, True, True, False]),
    )
    sc = dataclasses.replace(sc, bootstrap=torch.tensor([7.0, 5.0, 3.0, 9.0]))
    base = dataclasses.replace(tiny_cfg().algo, gamma=1.0, lam=1.0)
    boot = ALGORITHMS.get("ppo")(traj, sc, traj.rewards, base).returns
    cut = dataclasses.replace(base, truncation="terminal")
    term = ALGORITHMS.get("ppo")(traj, sc, traj.rewards, cut).returns
    # rewards to go at the trained tokens 1, 2, 4: [2, 2, 1], [1, 1, 1], [0, 0, 0], [2, 2, 2]
    assert term[:, [1, 2, 4]].tolist() == [[2, 2, 1], [1, 1, 1], [0, 0, 0], [2, 2, 2]]
    # bootstrapped: + 5 and + 3 on the two cut-off episodes; the ended ones unchanged
    assert boot[:, [1, 2, 4]].tolist() == [[2, 2, 1], [6, 6, 6], [3, 3, 3], [2, 2, 2]]
    with pytest.raises(ConfigError, match="truncation"):
        dataclasses.replace(base, truncation="zero")


def test_sft_learns_the_solver(tok):
    cfg = tiny_cfg(
        **{"sft.episodes": 64, "sft.epochs": 10, "sft.epsilon": 0.0, "sft.batch_size": 8}
    )
    agent = build_agent("tiny", tokenizer=tok, seed=0)
    losses = sft(agent, cfg)
    assert len(losses) == 10 * 8
    assert sum(losses[-8:]) / 8 < 0.25 * losses[0]


def _gated_run(tmp_path, monkeypatch, name, seen, **over):
    """A short SFT + 1-iteration run whose held-out evaluations report the state_exact values
    ``seen`` in turn (the real evaluation runs; only that number is scripted)."""
    from tokenergy.algos import lm
    from tokenergy.runs import Run

    real, script = lm.evaluate, list(seen)

    def evaluate(agent, cfg, par=lm._SINGLE):
        ev = real(agent, cfg, par=par)
        return {**ev, "eval/state_exact": script.pop(0) if script else 0.0}

    monkeypatch.setattr(lm, "evaluate", evaluate)
    cfg = tiny_cfg(**{"sft.episodes": 16, "sft.epochs": 2, "sft.batch_size": 8, **over})
    agent = build_agent("tiny", seed=0)
    with Run(tmp_path / name, cfg) as run:
        train_lm(cfg, run, agent=agent)
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return rows, agent


def test_sft_gate_trains_on_until_the_agent_states_what_it_sees(tmp_path, monkeypatch):
    gate = {"sft.min_state_exact": 0.9, "sft.max_rounds": 3}
    # below the gate after round 1 (0.5), through it after round 2 (0.95): two rounds of
    # 2 epochs x 2 steps, the second's steps numbered after the first's
    rows, _ = _gated_run(tmp_path, monkeypatch, "two", [0.5, 0.95, 0.3], **gate)
    steps = [r["sft/step"] for r in rows if "sft/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8]
    rounds = [(r["sft/round"], r["sft/state_exact"]) for r in rows if "sft/round" in r]
    assert rounds == [(1, 0.5), (2, 0.95)]
    first = next(r for r in rows if r.get("train/iteration") == 0)
    assert first["eval/state_exact"] == 0.95  # iteration 0 is the passing evaluation
    assert not any("sft/gate_failed" in r for r in rows)
    # never through it: max_rounds rounds, then the run goes on and says so
    rows, _ = _gated_run(tmp_path, monkeypatch, "never", [0.1, 0.2, 0.3], **gate)
    assert [r["sft/round"] for r in rows if "sft/round" in r] == [1, 2, 3]
    assert max(r["sft/step"] for r in rows if "sft/loss" in r) == 12
    assert sum(r.get("sft/gate_failed", 0) for r in rows) == 1
    assert rows[-1]["train/iteration"] == 1


def test_an_agent_through_the_sft_gate_at_once_trains_as_without_it(tmp_path, monkeypatch):
    plain, a = _gated_run(tmp_path, monkeypatch, "plain", [0.95])
    gated, b = _gated_run(
        tmp_path, monkeypatch, "gated", [0.95], **{"sft.min_state_exact": 0.9, "sft.max_rounds": 3}
    )

    def untimed(rows):  # everything but the perf/ timings and the gate's own rows
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]

    assert untimed(r for r in gated if "sft/round" not in r) == untimed(plain)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_sft_gate_config_errors():
    with pytest.raises(ConfigError, match=r"sft.min_state_exact: must be in \[0, 1\]"):
        tiny_cfg(**{"sft.min_state_exact": 1.5})
    with pytest.raises(ConfigError, match=r"sft.max_rounds"):
        tiny_cfg(**{"sft.max_rounds": 0})
    # tree_search's scratchpad has no state part: nothing for the gate to read
    with pytest.raises(ConfigError, match=r"sft.min_state_exact: tree_search's scratchpad"):
        tiny_cfg(**{"env.name": "tree_search", "sft.min_state_exact": 0.5})
    assert tiny_cfg(**{"env.name": "sudoku4", "sft.min_state_exact": 0.5}).sft.max_rounds == 1


def test_lm_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"rollout.group_size: GRPO needs at least 2"):
        tiny_cfg(**{"algo.name": "grpo"})
    with pytest.raises(
        ConfigError, match=r"env.name: unknown text environment 'sokobn'.*'sokoban'"
    ):
        tiny_cfg(**{"env.name": "sokobn"})
    with pytest.raises(ConfigError, match=r"env.kwargs: frozenlake: .*unexpected keyword"):
        tiny_cfg(**{"env.kwargs": {"slippery": True}})
    with pytest.raises(ConfigError, match=r"algo.name: unknown algorithm 'ppo2'"):
        tiny_cfg(**{"algo.name": "ppo2"})
    with pytest.raises(ConfigError, match=r"algo.minibatches: must divide rollout.episodes"):
        tiny_cfg(**{"algo.minibatches": 3})
    with pytest.raises(ConfigError, match=r"model.critic: must be shared or separate"):
        tiny_cfg(**{"model.critic": "own"})
    with pytest.raises(ConfigError, match=r"model.critic: only ppo .*not reinforce"):
        tiny_cfg(**{"model.critic": "separate", "algo.name": "reinforce"})
    with pytest.raises(ConfigError, match=r"algo.loss_normalize: must be mask or weights"):
        tiny_cfg(**{"algo.loss_normalize": "tokens"})
    with pytest.raises(ConfigError, match=r"algo.group_scale: must be group, batch or none"):
        tiny_cfg(**{"algo.group_scale": "std"})
    with pytest.raises(ConfigError, match=r"rollout.keep_groups"):
        tiny_cfg(**{"rollout.keep_groups": 0.0})
    with pytest.raises(ConfigError, match=r"eval.maps"):
        tiny_cfg(**{"eval.maps": -1})
    with pytest.raises(ConfigError, match=r"model.grid: row / column embeddings are built for"):
        tiny_cfg(**{"model.grid": True, "model.arch": "gpt2"})


def test_every_logged_metric_is_documented(tmp_path):
    from pathlib import Path

    from tokenergy.runs import Run

    doc = Path(__file__).parent.parent.joinpath("docs", "metrics.md").read_text()
    base = {"sft.episodes": 4, "sft.batch_size": 4, "algo.ent_coef": 0.01, "algo.kl_in": "loss"}
    energy = [  # every energy metric appears in one of these runs
        {"energy.weighting": "actfocus", "energy.reward_beta": 0.1, "energy.prior_beta": 0.1,
         "eval.diagnose_seeds": 2, "eval.diagnose_group": 2},
        {"energy.source": "discriminator", "energy.weighting": "bottleneck"},
        {"energy.source": "uncertainty", "algo.sft_coef": 0.1, "algo.reward_whiten": True,
         "rollout.curiosity_coef": 0.1, "algo.kl_target": 0.01},
    ]  # fmt: skip
    keys = set()
    for i, extra in enumerate([{}, *energy]):
        cfg = tiny_cfg(**base, **extra)
        with Run(tmp_path / f"r{i}", cfg) as run:
            train_lm(cfg, run)
        for line in (tmp_path / f"r{i}" / "metrics.jsonl").read_text().splitlines():
            keys |= set(json.loads(line))
    for key in keys:
        assert f"`{key}`" in doc, f"{key} is logged but not documented in docs/metrics.md"


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_same_seed_same_run(tmp_path, algo):
    """Two runs of one config give the same metrics.jsonl, timings aside."""
    from tokenergy.runs import Run

    cfg = tiny_cfg(
        **{
            "algo.name": algo,
            "rollout.group_size": 2 if algo == "grpo" else 1,
            "sft.episodes": 8,
            "sft.batch_size": 4,
            "algo.iterations": 2,
        }
    )
    rows = []
    for k in range(2):
        with Run(tmp_path / f"r{k}", cfg) as run:
            train_lm(cfg, run)
        lines = (tmp_path / f"r{k}" / "metrics.jsonl").read_text().splitlines()
        rows.append(
            [{n: v for n, v in json.loads(x).items() if not n.startswith("perf/")} for x in lines]
        )
    assert rows[0] == rows[1] and len(rows[0]) > 3


def test_reward_variance_filter_trains_on_the_kept_groups(tmp_path):
    from tokenergy.runs import Run

    cfg = tiny_cfg(**{"algo.name": "grpo", "rollout.episodes": 8, "rollout.group_size": 2,
                      "rollout.keep_groups": 0.5, "algo.ent_coef": 0.01})  # fmt: skip
    with Run(tmp_path / "f", cfg) as run:
        result = train_lm(cfg, run, agent=build_agent("tiny", seed=0))
    assert result.history[-1]["rollout/trained_episodes"] == 4  # 2 of the 4 groups
    assert result.history[-1]["train/episodes"] == 8


def test_value_scale_multiplies_the_heads_output(tok):
    from tokenergy.models.lm import separate_critic

    agent = build_agent("tiny", tokenizer=tok)
    with torch.no_grad():
        agent.value_head.net[2].bias.fill_(0.5)
    ids = torch.tensor([[1, 2, 3]])
    assert agent(ids).values.tolist() == [[0.5, 0.5, 0.5]]
    agent.value_scale = 10.0
    assert agent(ids).values[0].tolist() == pytest.approx([5.0, 5.0, 5.0])
    separate_critic(agent)  # the critic with a transformer of its own is scaled the same way
    assert agent(ids).values[0].tolist() == pytest.approx([5.0, 5.0, 5.0])
    assert tiny_cfg(**{"algo.value_scale": 10}).algo.value_scale == 10.0
    with pytest.raises(ConfigError, match=r"algo\.value_scale"):
        tiny_cfg(**{"algo.value_scale": 0})


def test_forward_by_length_gives_the_whole_batch_forward_and_its_gradient(tok):
    """Chunks of rows of similar length, each cut to its longest row: the same logits and
    values on every real token, and the same gradient of a masked loss, as one forward."""
    from tokenergy.algos.update import forward_by_length
    from tokenergy.models.lm import separate_critic

    agent = separate_critic(build_agent("tiny", tokenizer=tok, seed=7))
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([30, 7, 19, 30, 3, 12, 25, 9, 16, 28, 5])
    tokens = torch.randint(10, len(tok), (len(lengths), 30), generator=g)
    attn = torch.arange(30)[None] < lengths[:, None]
    tokens[~attn] = tok.pad_token_id

    def loss_and_grads(out):
        loss = (out.logits.log_softmax(-1)[..., 5] * attn).sum() + (out.values * attn).sum()
        grads = torch.autograd.grad(loss, [p for p in agent.parameters() if p.requires_grad])
        return loss.detach(), grads

    whole = agent(tokens, attn.long())
    chunked = forward_by_length(agent, tokens, attn.long(), lengths, rows_per_chunk=3)
    torch.testing.assert_close(chunked.logits[attn], whole.logits[attn], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked.values[attn], whole.values[attn], atol=1e-5, rtol=1e-5)
    (l1, g1), (l2, g2) = loss_and_grads(whole), loss_and_grads(chunked)
    torch.testing.assert_close(l2, l1, atol=1e-3, rtol=1e-5)
    for a, b in zip(g2, g1, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_one_whole_batch_update_reuses_its_own_logprobs(monkeypatch):
    """GRPO with one update over the whole batch: the scoring pass skips the policy (its
    log-probs are the update's own, the ratio is 1) and the run is the one that scores it."""
    import tokenergy.algos.lm as lm

    over = {
        "algo.name": "grpo", "algo.epochs": 1, "algo.minibatches": 1, "algo.iterations": 2,
        "algo.kl_coef": 0.05, "algo.kl_in": "loss", "rollout.episodes": 8,
        "rollout.group_size": 4, "energy.weighting": "actfocus",
        "energy.source": "ref_free_energy",
    }  # fmt: skip
    cfg = tiny_cfg(**over)
    assert lm.reuses_update_logprobs(cfg)
    assert not lm.reuses_update_logprobs(tiny_cfg(**{**over, "algo.minibatches": 2}))
    assert not lm.reuses_update_logprobs(tiny_cfg(**{**over, "energy.source": "surprisal"}))
    reused = lm.train_lm(cfg).history
    monkeypatch.setattr(lm, "reuses_update_logprobs", lambda cfg: False)
    scored = lm.train_lm(cfg).history
    keys = ["loss/policy", "loss/entropy", "kl/ref", "train/grad_norm", "rollout/tokens"]
    for r, s in zip(reused, scored, strict=True):
        assert r["train/ratio_max"] == 1.0
        for k in keys:
            assert r[k] == pytest.approx(s[k], rel=1e-4, abs=1e-6), k


def test_right_padded_batches_run_causal_attention_alone(tok):
    """A right-padded mask is dropped (causal attention gives every real token the same
    output); any other mask is kept, and the outputs on real tokens agree either way."""
    from tokenergy.models.lm import causal_only

    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    assert causal_only(right) is None
    assert causal_only(left) is left
    assert causal_only(None) is None
    agent = build_agent("tiny", tokenizer=tok, seed=3).eval()
    tokens = torch.randint(10, len(tok), (3, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        masked = agent.policy(input_ids=tokens, attention_mask=right).logits
        causal = agent(tokens, right).logits
    real = right.bool()
    torch.testing.assert_close(causal[real], masked[real], atol=1e-5, rtol=1e-5)


def test_the_null_control_trains_on_shuffled_returns(monkeypatch):
    """``algo.null_returns``: the rewards the credit stage reads are the batch's returns,
    permuted among its episodes; off, the trainer never shuffles."""
    import tokenergy.algos.lm as lm

    seen = []
    real = lm.shuffled_returns

    def spy(rewards, mask, gen):
        out = real(rewards, mask, gen)
        seen.append((rewards.sum(1), out.sum(1)))
        return out

    monkeypatch.setattr(lm, "shuffled_returns", spy)
    train_lm(tiny_cfg(**{"algo.iterations": 2}))
    assert seen == []
    train_lm(tiny_cfg(**{"algo.iterations": 2, "algo.null_returns": True}))
    assert len(seen) == 2
    for before, after in seen:
        assert sorted(after.tolist()) == pytest.approx(sorted(before.tolist()))


@pytest.mark.parametrize("source", ["ref_entropy", "logprob_shift", "surprisal"])
def test_the_papers_signal_ablation_sources_drive_actfocus(source):
    """The signals of the paper's ablation (reference entropy, log-prob shift, policy NLL) run
    through the same z-score and sigmoid: a run keeps its reference for them and its action
    weights stay in [1, 1 + beta]."""
    cfg = tiny_cfg(
        **{"energy.weighting": "actfocus", "energy.source": source, "energy.beta": 0.5,
           "algo.iterations": 1, "rollout.episodes": 4}
    )  # fmt: skip
    assert cfg.energy.needs_reference == (source != "surprisal")  # policy NLL: the policy alone
    row = train_lm(cfg).history[-1]
    assert math.isfinite(row["loss/policy"])
    assert 1.0 <= row["weights/max"] <= 1.5 + 1e-6


def test_the_committed_demo_agent_reads_its_room():
    """`make demo` starts from agents/sokoban-sft: greedy on 24 held-out rooms its scratchpad
    states the player, box and target exactly (the SFT agent sees; docs/results/perception.md),
    and it solves some rooms and not all (RL has room)."""
    from tokenergy.config import load_config
    from tokenergy.models import load_agent
    from tokenergy.rollout.episodes import evaluate

    cfg = load_config("configs/demo.yaml")
    assert cfg.model.path == "agents/sokoban-sft" and cfg.sft.episodes == 0
    ev = evaluate(load_agent(cfg.model.path), cfg, episodes=24, temperature=0.0, maps=0)
    assert ev["eval/state_exact"] >= 0.95
    assert ev["eval/invalid_rate"] == 0.0
    assert 0.1 <= ev["eval/success"] <= 0.8

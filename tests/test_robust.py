"""The robustness kit of the LM trainer: schedules, curriculum, frozen lower blocks, success
replay and best-checkpoint keeping."""

import copy
import json

import pytest
import torch

from tokenergy.algos.lm import Curriculum, sft, train_lm
from tokenergy.algos.update import scheduled
from tokenergy.config import ConfigError
from tokenergy.models import build_agent
from tokenergy.models.lm import freeze_lower_blocks
from tokenergy.runs import Run


def cfg_of(**over):
    """Depth-1 tree searches (two leaves): quick to learn, so successes come early."""
    from test_lm import tiny_cfg

    base = {
        "env.name": "tree_search",
        "env.kwargs": {"k": 2, "depth": 1},
        "env.max_turns": 2,
        "rollout.episodes": 16,
        "rollout.max_turn_tokens": 16,
        "rollout.temperature": 0.3,
        "algo.iterations": 3,
        "algo.lr": 1e-3,
        "eval.episodes": 8,
    }
    return tiny_cfg(**{**base, **over})


@pytest.fixture(scope="module")
def sft_agent():
    """A tiny agent fitted to depth-1 tree searches: it answers, and often right."""
    agent = build_agent("tiny", seed=0)
    sft(agent, cfg_of(**{"sft.episodes": 64, "sft.epochs": 4, "sft.batch_size": 8,
                         "sft.lr": 0.01, "sft.epsilon": 0.0}))  # fmt: skip
    return agent


def test_linear_schedules():
    assert scheduled(0.2, None, 5, 10) == 0.2
    assert scheduled(0.2, 0.1, 0, 11) == pytest.approx(0.2)
    assert scheduled(0.2, 0.1, 5, 11) == pytest.approx(0.15)
    assert scheduled(0.2, 0.1, 10, 11) == pytest.approx(0.1)
    assert scheduled(0.01, 0.0, 0, 1) == 0.01  # a single iteration keeps the start


def test_curriculum_moves_on_when_the_window_passes_the_threshold():
    cfg = cfg_of(**{"env.name": "treasure", "env.kwargs": {"difficulty": 2},
                    "env.curriculum_kwarg": "difficulty", "env.curriculum_values": [0, 1, 2],
                    "env.curriculum_threshold": 0.5, "env.curriculum_window": 2})  # fmt: skip
    cur = Curriculum(cfg)
    assert cur.config().env.kwargs == {"difficulty": 0}
    cur.after_iteration(0.9)  # one iteration is not a full window yet
    assert cur.level == 0
    cur.after_iteration(0.2)  # mean 0.55 >= 0.5
    assert cur.level == 1 and cur.config().env.kwargs == {"difficulty": 1}
    cur.after_iteration(0.6)
    cur.after_iteration(0.3)  # mean 0.45: stay
    assert cur.level == 1
    cur.after_iteration(0.8)  # window (0.3, 0.8): mean 0.55
    assert cur.level == 2
    for _ in range(5):
        cur.after_iteration(1.0)
    assert cur.level == 2  # the last level is the last
    state = cur.state_dict()
    again = Curriculum(cfg)
    again.load_state_dict(state)
    assert again.level == 2 and cfg.env.kwargs == {"difficulty": 2}  # the task is unchanged
    with pytest.raises(ConfigError, match="curriculum_values"):
        cfg_of(**{"env.name": "treasure", "env.kwargs": {}, "env.curriculum_kwarg": "difficulty",
                  "env.curriculum_values": [0, 99]})  # fmt: skip


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_freeze_lower_blocks(arch):
    agent = build_agent("tiny", arch=arch, seed=0)
    frozen = freeze_lower_blocks(agent.policy, 1)
    trainable = [n for n, p in agent.policy.named_parameters() if p.requires_grad]
    block0 = ".layers.0." if arch == "llama" else ".h.0."
    block1 = ".layers.1." if arch == "llama" else ".h.1."
    assert frozen and all(block1 not in n for n in frozen)
    assert any(block0 in n for n in frozen) and not any(block0 in n for n in trainable)
    assert any(block1 in n for n in trainable)
    # tied embeddings are the LM head: they keep training
    emb = agent.policy.get_input_embeddings().weight
    assert emb.requires_grad
    with pytest.raises(ValueError, match="has 2 blocks"):
        freeze_lower_blocks(build_agent("tiny", seed=0).policy, 3)


def test_rl_with_top_block_only_leaves_lower_blocks_untouched(sft_agent):
    cfg = cfg_of(**{"model.train_top_blocks": 1, "algo.iterations": 2})
    agent = copy.deepcopy(sft_agent)
    before = {n: p.detach().clone() for n, p in agent.policy.named_parameters()}
    train_lm(cfg, agent=agent)
    after = dict(agent.policy.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before if ".layers.0." in n)
    assert any(not torch.equal(before[n], after[n]) for n in before if ".layers.1." in n)


def test_schedules_replay_and_best_checkpoint_in_a_run(tmp_path, sft_agent):
    cfg = cfg_of(**{"rollout.replay_ratio": 0.5, "algo.clip_eps": 0.3, "algo.clip_eps_final": 0.1,
                    "algo.ent_coef": 0.02, "algo.ent_coef_final": 0.0, "algo.lr": 4e-4,
                    "algo.lr_final": 0.0, "eval.keep_best": True})  # fmt: skip
    with Run(tmp_path / "run", cfg) as run:
        res = train_lm(cfg, run, agent=copy.deepcopy(sft_agent))
    h = res.history
    assert [r["train/clip_eps"] for r in h] == pytest.approx([0.3, 0.2, 0.1])
    assert [r["train/ent_coef"] for r in h] == pytest.approx([0.02, 0.01, 0.0])
    assert [r["train/lr"] for r in h] == pytest.approx([4e-4, 2e-4, 0.0])
    # after SFT the agent solves some depth-1 trees; their episodes come back in later batches:
    # 0.5 x 16 = 8 per batch, or all the successes so far when there are fewer
    wins = [round(r["rollout/success"] * 16) for r in h]
    assert [r["rollout/replayed"] for r in h] == [min(8, sum(wins[:i])) for i in range(3)]
    assert sum(wins[:2]) > 0
    best = json.loads((tmp_path / "run" / "best" / "best.json").read_text())
    successes = [e["eval/success"] for e in res.evals]
    assert best["eval/success"] == max(successes)
    assert best["iteration"] == res.evals[successes.index(max(successes))]["train/iteration"]
    with pytest.raises(ConfigError, match="replay"):
        cfg_of(**{"algo.name": "grpo", "rollout.group_size": 2, "rollout.replay_ratio": 0.5})


def test_curriculum_in_a_run_reaches_the_next_level():
    cfg = cfg_of(**{"env.name": "treasure", "env.kwargs": {"difficulty": 1}, "env.max_turns": 3,
                    "env.curriculum_kwarg": "difficulty",
                    "env.curriculum_values": [0, 1], "env.curriculum_threshold": 0.0,
                    "env.curriculum_window": 1})  # fmt: skip
    h = train_lm(cfg, agent=build_agent("tiny", seed=0)).history
    assert [r["train/curriculum_level"] for r in h] == [0, 1, 1]

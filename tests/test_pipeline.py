"""The SLM pipeline: corpora and preference pairs, text measures, merge-and-reinit, the
reward model, PPO inside the envelope, and the sizes x domains grid."""

import copy
import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

from tokenergy.algos import pipeline as pl
from tokenergy.algos import update as stage
from tokenergy.config import ConfigError, config_from_dict
from tokenergy.envs.corpora import (
    DOMAINS,
    distinct_n,
    make_corpus,
    preference_pairs,
    sentences,
    win_rate,
)
from tokenergy.experiments import plan_pipeline_grid
from tokenergy.reports.pipeline import GRID_COLUMNS, grid_table

# the stages before PPO at a dozen steps each and a small evaluation: for the tests of the PPO
# loop's envelope and of determinism, which need a run that goes through, not one that learns
QUICK = {"pretrain.steps": 12, "sft.steps": 12, "rm.steps": 12, "eval.prompts": 8,
         "eval.pairs": 16}  # fmt: skip


def cfg_of(**over):
    data = {
        "kind": "pipeline",
        "corpus": {"train_docs": 200, "heldout_docs": 64, "pretrain_docs": 200},
        "pretrain": {"steps": 60},
        "sft": {"steps": 60},
        "rm": {"steps": 60},
        "ppo": {"iterations": 3, "prompts": 16, "max_new_tokens": 40},
        "eval": {"prompts": 32, "pairs": 64},
        "log": {"progress": False, "tensorboard": False},
    }
    for dotted, value in over.items():
        sec, key = dotted.split(".")
        data.setdefault(sec, {})[key] = value
    return config_from_dict(data)


# --------------------------------------------------------------------------- corpora


@pytest.mark.parametrize("domain", list(DOMAINS))
def test_corpus_is_seeded_split_and_covered_by_the_tokenizer(domain):
    docs = make_corpus(domain, 50, seed=3)
    assert docs == make_corpus(domain, 50, seed=3)
    assert docs != make_corpus(domain, 50, seed=4)
    tok = pl.pipeline_tokenizer()
    for d in docs:
        assert d.text == f"{d.prompt} {d.continuation}"
        assert sentences(d.prompt) == [d.prompt]  # the prompt is the first sentence
        ids = tok(d.text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
    if domain == "news":
        assert all(sentences(d.text)[-1].startswith("summary :") for d in docs)


@pytest.mark.parametrize("domain", list(DOMAINS))
def test_preference_pairs_follow_their_rules(domain):
    docs = make_corpus(domain, 30, seed=0)
    pairs = preference_pairs(docs, seed=1)
    assert [p.kind for p in pairs[:6]] == ["shuffle", "mismatch", "drop"] * 2
    for doc, p in zip(docs, pairs, strict=True):
        chosen, rejected = p.chosen.split(), p.rejected.split()
        assert p.chosen == doc.text and p.prompt == doc.prompt and p.rejected != p.chosen
        if p.kind == "shuffle":  # the same words, fewer of them, another order
            assert not Counter(rejected) - Counter(chosen)
            assert len(rejected) < len(chosen)
        elif p.kind == "mismatch":  # all but the last sentence kept; it comes from another doc
            c, r = sentences(p.chosen), sentences(p.rejected)
            assert r[:-1] == c[:-1] and r[-1] != c[-1]
            assert any(sentences(o.text)[-1] == r[-1] for o in docs if o is not doc)
        else:  # drop: the prompt, then a strict subsequence of the continuation
            assert p.rejected.startswith(doc.prompt)
            it = iter(chosen)
            assert all(w in it for w in rejected) and len(rejected) < len(chosen)


def test_distinct_n_on_hand_examples():
    assert distinct_n(["a b a b"], 1) == 0.5  # {a, b} of 4
    assert distinct_n(["a b a b"], 2) == pytest.approx(2 / 3)  # {ab, ba} of ab ba ab
    assert distinct_n(["a b", "c d"], 2) == 1.0
    assert distinct_n(["a", ""], 2) == 0.0  # no bigram at all


def test_win_rate_formula():
    assert win_rate(0.0, 1.0, 2.0) == 0.5
    assert win_rate(1.0, 0.6, 0.8) == pytest.approx(0.841345, abs=1e-6)  # Φ(1)
    assert win_rate(-1.0, 0.6, 0.8) == pytest.approx(1 - 0.841345, abs=1e-6)
    assert win_rate(0.3, 0.0, 0.0) == 1.0 and win_rate(0.0, 0.0, 0.0) == 0.5


def test_bradley_terry_loss_by_hand():
    loss = pl.bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0]))
    assert loss.item() == pytest.approx((math.log1p(math.exp(-2.0)) + math.log(2.0)) / 2)


# --------------------------------------------------------------------------- merge-and-reinit


def _sft_like(cfg):
    """A tiny LM with a LoRA adapter whose B matrices are non-zero (as after SFT)."""
    tok = pl.pipeline_tokenizer()
    model = pl._lora(pl._build_lm(cfg, tok), cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return model, tok


def test_merge_and_reinit_keeps_the_sft_model_and_trains_a_fresh_adapter(tmp_path):
    cfg = cfg_of()
    sft_model, tok = _sft_like(cfg)
    ids = torch.randint(5, len(tok), (2, 12))
    attn = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        want = sft_model(input_ids=ids, attention_mask=attn).logits
    policy, reference = pl.merge_and_reinit(sft_model, cfg)
    with torch.no_grad():
        assert torch.allclose(reference(input_ids=ids, attention_mask=attn).logits, want, atol=1e-5)
        assert torch.allclose(policy(input_ids=ids, attention_mask=attn).logits, want, atol=1e-5)
    assert not any(p.requires_grad for p in reference.parameters())
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)

    # without it: the SFT adapter reloaded the plain peft way is frozen, so a step of
    # policy + value loss moves only the value head
    naive, _ = pl.reload_sft_adapter(sft_model, tmp_path / "adapter")
    with torch.no_grad():
        assert torch.allclose(naive(input_ids=ids, attention_mask=attn).logits, want, atol=1e-5)
    for label, pol, moves in (("naive", naive, False), ("merged", policy, True)):
        agent = pl.AgentModel(pol, tok)
        head0 = copy.deepcopy(agent.value_head.state_dict())
        opt = torch.optim.AdamW([p for p in agent.parameters() if p.requires_grad], lr=1e-2)
        out = agent(ids, attn)
        logits, values = out.logits, out.values
        loss = -torch.log_softmax(logits, -1)[..., 7].mean() + ((values - 1.0) ** 2).mean()
        loss.backward()
        opt.step()
        with torch.no_grad():
            after = pol(input_ids=ids, attention_mask=attn).logits
        assert (not torch.allclose(after, want, atol=1e-4)) == moves, label
        assert any(not torch.equal(head0[k], v) for k, v in agent.value_head.state_dict().items())


def test_pipeline_refuses_a_policy_that_cannot_learn(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="only the value head would learn"):
        pl.run_pipeline(cfg_of(**QUICK, **{"ppo.merge_reinit": False}))


# --------------------------------------------------------------------------- whole runs


@pytest.fixture(scope="module")
def tiny_run():
    return pl.run_pipeline(cfg_of(**{"ppo.iterations": 12}))


def test_reward_model_ranks_held_out_pairs_and_ppo_raises_its_score(tiny_run):
    s = tiny_run.summary
    assert s["rm/accuracy"] > 0.7  # 0.5 is chance
    assert s["rm/accuracy_drop"] > 0.8
    assert s["delta"] > 0 and s["win_rate"] > 0.5  # PPO continuations score higher than SFT's
    assert s["win_rate"] == pytest.approx(
        win_rate(s["delta"], s["sft/score_std"], s["ppo/score_std"])
    )
    assert s["ppo/weights_finite"] == 1.0
    scores = [r["ppo/score"] for r in tiny_run.history]
    assert sum(scores[-4:]) / 4 > sum(scores[:4]) / 4
    for key in ("sft/perplexity", "ppo/perplexity", "pretrain/perplexity"):
        assert 1.0 < s[key] < len(pl.pipeline_tokenizer())
    assert 0 < s["sft/distinct2"] <= 1


def _patch_update_logprobs(monkeypatch, shift):
    """Log-probs computed with gradient (the update's) come out ``shift`` nats higher."""
    real = stage.token_logprobs

    def patched(logits, ids):
        out = real(logits, ids)
        return out + shift if torch.is_grad_enabled() else out

    monkeypatch.setattr(stage, "token_logprobs", patched)


def test_a_huge_ratio_is_skipped(monkeypatch):
    _patch_update_logprobs(monkeypatch, 5.0)  # ratio e^5 ~ 148
    cfg = cfg_of(**QUICK, **{"ppo.iterations": 2})
    hist = pl.run_pipeline(cfg).history
    n = cfg.ppo.epochs * cfg.ppo.minibatches
    assert [r["envelope/ratio_skips"] for r in hist] == [n, 2 * n]
    assert [r["ppo/updates"] for r in hist] == [0, 0]
    off = pl.run_pipeline(cfg_of(**QUICK, **{"ppo.iterations": 1, "envelope.ratio_cap": None}))
    off = off.history
    assert off[0]["ppo/updates"] == n


def _nan_loss_on(monkeypatch, calls):
    real = stage.ppo_policy_loss
    count = {"n": 0}

    def patched(*a, **k):
        count["n"] += 1
        loss, m = real(*a, **k)
        return (loss * float("nan"), m) if count["n"] in calls else (loss, m)

    monkeypatch.setattr(stage, "ppo_policy_loss", patched)


def test_a_nan_step_is_rolled_back_and_without_the_envelope_the_weights_break(monkeypatch):
    _nan_loss_on(monkeypatch, {2})
    on = pl.run_pipeline(cfg_of(**QUICK, **{"ppo.iterations": 2})).history
    assert on[-1]["envelope/rollbacks"] == 1 and on[-1]["ppo/weights_finite"] == 1.0
    _nan_loss_on(monkeypatch, {2})
    off = pl.run_pipeline(cfg_of(**QUICK, **{"ppo.iterations": 3, "envelope.rollback": False}))
    assert off.history[-1]["ppo/weights_finite"] == 0.0
    assert len(off.history) == 1  # collapsed in the first iteration: PPO stops there
    s = off.summary
    assert s["ppo/collapsed"] == 1.0 and math.isnan(s["ppo/score_mean"]) and math.isnan(s["delta"])
    assert math.isfinite(s["sft/score_mean"])  # the SFT side is still measured


def test_bf16_pipeline_trains_finite():
    hist = pl.run_pipeline(cfg_of(**QUICK, **{"envelope.precision": "bf16", "ppo.iterations": 2}))
    hist = hist.history
    assert all(r["ppo/updates"] > 0 and r["ppo/weights_finite"] == 1.0 for r in hist)


def test_config_errors():
    with pytest.raises(ConfigError, match=r"corpus\.domain"):
        cfg_of(**{"corpus.domain": "poems"})
    with pytest.raises(ConfigError, match=r"envelope\.precision"):
        cfg_of(**{"envelope.precision": "fp8"})
    with pytest.raises(ConfigError, match=r"ppo\.minibatches"):
        cfg_of(**{"ppo.minibatches": 3})
    with pytest.raises(ConfigError, match="stop_after"):
        config_from_dict({"kind": "pipeline", "stop_after": "pretrain", "pretrain": {"steps": 0}})


# --------------------------------------------------------------------------- grids


def test_grid_plan_shares_one_pretraining_per_size_and_seed(tmp_path):
    pre, runs = plan_pipeline_grid(cfg_of(), ["tiny", "small"], ["story", "news"], 2, tmp_path)
    assert len(pre) == 4 and len(runs) == 8
    assert all(s.cfg.stop_after == "pretrain" for s in pre)
    for s in runs:
        size, domain = s.out.parts[-3], s.out.parts[-2]
        assert s.cfg.model.size == size and s.cfg.corpus.domain == domain
        want = tmp_path / "pretrain" / size / s.out.parts[-1] / "pretrained"
        assert s.cfg.model.path == str(want)


def test_grid_table_reads_the_summaries(tmp_path):
    for size, domain, k, delta in [("tiny", "story", 0, 1.0), ("tiny", "story", 1, 3.0),
                                   ("small", "news", 0, -1.0)]:  # fmt: skip
        d = tmp_path / size / domain / f"seed_{k}"
        d.mkdir(parents=True)
        summary = {key: 0.5 for key, _, _ in GRID_COLUMNS}
        summary["ppo/collapsed"] = float(k == 1)
        summary.update({"delta": delta, "sft/perplexity": 2.0 + k})
        (d / "summary.json").write_text(json.dumps(summary))
    md, _ = grid_table(tmp_path)
    lines = md.splitlines()
    assert lines[2].startswith("| tiny | story | 2 |") and "2.00 ± 1.00" in lines[2]  # Δ
    assert lines[2].endswith("| 0.50 ± 0.50 |")  # one of the two seeds collapsed
    assert lines[3].startswith("| small | news | 1 |")
    assert (tmp_path / "table.md").read_text() == md
    assert (tmp_path / "headroom.png").stat().st_size > 1000


def test_every_pipeline_metric_is_documented(tmp_path):
    from pathlib import Path

    from tokenergy.runs import Run

    doc = Path(__file__).parent.parent.joinpath("docs", "metrics.md").read_text()
    doc = doc[doc.index("## The SLM pipeline") :]
    cfg = cfg_of(**{"ppo.iterations": 1, "pretrain.steps": 11, "sft.steps": 11, "rm.steps": 11})
    with Run(tmp_path / "run", cfg) as run:
        pl.run_pipeline(cfg, run)
    keys = set()
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        keys |= set(json.loads(line))
    keys |= set(json.loads((tmp_path / "run" / "summary.json").read_text()))
    for key in keys:
        assert f"`{key}`" in doc, f"{key} is logged but not documented in docs/metrics.md"
    assert (tmp_path / "run" / "pretrained" / "config.json").is_file()
    assert len((tmp_path / "run" / "samples.jsonl").read_text().splitlines()) == 8


def test_same_seed_same_pipeline_with_two_threads():
    """Two runs of one pipeline config (pretraining, SFT, reward model, PPO) on two CPU
    threads give the same history and summary, timings aside."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = [pl.run_pipeline(cfg_of(**QUICK, **{"ppo.iterations": 2})) for _ in range(2)]
    finally:
        torch.set_num_threads(before)

    def timeless(row: dict) -> dict:
        return {k: v for k, v in row.items() if not any(w in k for w in ("perf", "second", "elapsed"))}  # fmt: skip

    assert [timeless(r) for r in runs[0].history] == [timeless(r) for r in runs[1].history]
    assert timeless(runs[0].summary) == timeless(runs[1].summary)


def test_the_pipeline_trains_through_the_lm_update_stage_with_its_own_settings():
    """The PPO learner hands the LM trainer's update stage the pipeline's settings (field by
    field, the KL a k1 reward) and the envelope's; one update over a collected batch steps the
    adapter and the value head only."""
    cfg = cfg_of(**{"ppo.clip_eps": 0.3, "ppo.epochs": 1, "ppo.minibatches": 2,
                    "ppo.value_clip": None, "ppo.kl_coef": 0.07, "envelope.ratio_cap": 9.0,
                    "envelope.rollback": False, "ppo.prompts": 4})  # fmt: skip
    model, tok = _sft_like(cfg)
    policy, reference = pl.merge_and_reinit(model, cfg)
    agent = pl.AgentModel(policy, tok)
    gen, device = torch.Generator().manual_seed(0), torch.device("cpu")
    learner = pl._learner(agent, cfg, gen, device)
    a = learner.algo
    assert (a.name, a.clip_eps, a.epochs, a.minibatches, a.value_clip) == ("ppo", 0.3, 1, 2, None)
    assert (a.kl_coef, a.kl_in, a.kl_kind, a.ratio_cap) == (0.07, "reward", "k1", 9.0)
    assert not learner.rollback and learner.trains_value and learner.ref is None
    docs = make_corpus("story", 16, seed=0)
    traj = pl._collect(agent, tok, docs, cfg, gen, np.random.default_rng(0))
    assert traj.batch_size == 4 and bool((traj.roles[traj.mask] == 2).all())  # action tokens
    sc = pl.score(agent, reference, traj)
    cr = pl._assign_credit(traj, sc, torch.tensor([1.0, -1.0, 0.5, 0.0]), 0.07, cfg)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    up = pl.update(learner, traj, sc, cr, 0)
    assert up.n_updates == 2 and learner.ratio_skips == 0
    moved = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("lora_" in n for n in moved)

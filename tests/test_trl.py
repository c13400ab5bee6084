"""ActFocusGRPOTrainer: TRL's GRPO loss with tokenergy's token weights, checked against the
weighted loss computed by hand on a tiny local model (skips without `make trl`)."""

import math

import pytest
import torch

pytest.importorskip("trl", reason="needs `make trl`")
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from tokenergy.energy import actfocus_softmax_weights, actfocus_weights
from tokenergy.integrations.trl import ActFocusGRPOTrainer, completion_roles
from tokenergy.models import build_agent
from tokenergy.rollout import token_logprobs
from tokenergy.types import Role


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    agent = build_agent("tiny", seed=0)
    d = tmp_path_factory.mktemp("trl") / "model"
    agent.policy.save_pretrained(d)
    agent.tokenizer.save_pretrained(d)
    return d, agent.tokenizer


def _trainer(model_dir, tmp_path, **kw):
    path, tok = model_dir
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, max_steps=2, report_to=[], use_cpu=True, beta=0.04,
        loss_type="bnpo", save_strategy="no", seed=0,
    )  # fmt: skip
    ds = Dataset.from_dict({"prompt": ["S F F ⏎ F H G", "S F ⏎ F G"] * 4})

    def reward(completions, **_):
        return [float(len(c)) for c in completions]

    return ActFocusGRPOTrainer(
        model=str(path), reward_funcs=reward, args=args, train_dataset=ds,
        processing_class=tok, **kw,
    )  # fmt: skip


def _inputs(tok, model):
    ids = lambda s: tok(s, add_special_tokens=False).input_ids  # noqa: E731
    prompts = [ids("S F F ⏎ F H G"), ids("S F G ⏎ F H F")]
    completions = [
        ids("<think> go right </think> <answer> Right </answer>"),
        ids("<think> down </think> <answer> Down || Up </answer>"),
    ]
    t = max(map(len, completions))
    comp = torch.tensor([c + [tok.pad_token_id] * (t - len(c)) for c in completions])
    comp_mask = torch.tensor([[1] * len(c) + [0] * (t - len(c)) for c in completions])
    prompt = torch.tensor(prompts)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        logits = model(input_ids=torch.cat([prompt, comp], 1)).logits
        logp = token_logprobs(logits, torch.cat([prompt, comp], 1))[:, prompt.shape[1] :]
    return {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": comp,
        "completion_mask": comp_mask,
        "advantages": torch.tensor([1.0, -0.5]),
        "old_per_token_logps": logp + 0.3 * torch.randn(logp.shape, generator=g),
        "ref_per_token_logps": logp - torch.rand(logp.shape, generator=g),
        "num_items_in_batch": comp_mask.sum(),
    }


def test_completion_roles_read_the_tags(model_dir):
    _, tok = model_dir
    comp = torch.tensor(
        [tok("<think> go </think> <answer> Up </answer>", add_special_tokens=False).input_ids]
    )
    R, A, F = int(Role.REASONING), int(Role.ACTION), int(Role.FORMAT)
    assert completion_roles(comp, tok).tolist() == [[F, R, F, F, A, F]]


@pytest.mark.parametrize("weighting", ["actfocus", "actfocus_softmax"])
def test_loss_equals_the_hand_weighted_grpo_loss(model_dir, tmp_path, weighting):
    kw = {"alpha": 0.3, "action_beta": 0.8, "lam": 0.8, "tau": 0.5}
    tr = _trainer(model_dir, tmp_path, weighting=weighting, **kw)
    tr.model.train()
    tr.current_gradient_accumulation_steps = 1
    inputs = _inputs(tr.processing_class, tr.model)
    loss = tr._compute_loss(tr.model, inputs)

    prompt, comp = inputs["prompt_ids"], inputs["completion_ids"]
    mask = inputs["completion_mask"].bool()
    logp, _, _ = tr._get_per_token_logps_and_entropies(  # TRL's own log-probs of the completion
        tr.model,
        torch.cat([prompt, comp], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
        comp.size(1),
    )
    roles = completion_roles(comp, tr.processing_class)
    ref = inputs["ref_per_token_logps"]
    if weighting == "actfocus":
        w = actfocus_weights(roles, -ref, mask, alpha=0.3, beta=0.8)
    else:
        w = actfocus_softmax_weights(roles, -ref, mask, alpha=0.3, lam=0.8, tau=0.5)
    ratio = torch.exp(logp - inputs["old_per_token_logps"])
    adv = inputs["advantages"][:, None]
    eps_lo, eps_hi = tr.epsilon_low, tr.epsilon_high
    surrogate = -torch.min(ratio * adv, ratio.clamp(1 - eps_lo, 1 + eps_hi) * adv)
    kl = torch.exp(ref - logp) - (ref - logp) - 1
    if tr.args.use_bias_correction_kl:  # TRL's importance correction of the KL term (default on)
        kl = kl * ratio
    expected = ((w * surrogate + tr.beta * kl) * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert w[roles == int(Role.REASONING)].unique().tolist() == pytest.approx([0.3])
    action = w[(roles == int(Role.ACTION)) & mask]
    if weighting == "actfocus":  # bounded in [1, 1 + beta]
        assert action.min().item() >= 1.0 and action.max().item() <= 1.8
    else:  # redistributed with mean 1
        assert action.mean().item() == pytest.approx(1.0, abs=1e-6)


def test_no_weighting_is_trls_own_loss(model_dir, tmp_path):
    tr = _trainer(model_dir, tmp_path, weighting="none")
    tr.model.train()
    tr.current_gradient_accumulation_steps = 1
    inputs = _inputs(tr.processing_class, tr.model)
    ours = tr._compute_loss(tr.model, inputs)
    theirs = GRPOTrainer._compute_loss(tr, tr.model, inputs)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert math.isfinite(ours.item())


def test_trains_end_to_end_and_logs_weights(model_dir, tmp_path):
    tr = _trainer(model_dir, tmp_path)
    tr.train()
    logged = [r for r in tr.state.log_history if "weights/action_share" in r]
    assert logged and all(0.0 <= r["weights/action_share"] <= 1.0 for r in logged)


def test_bad_arguments_are_clear(model_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown token weighting"):
        _trainer(model_dir, tmp_path, weighting="actfocuss")
    with pytest.raises(ValueError, match="lam must be in"):
        _trainer(model_dir, tmp_path, lam=2.0)
    path, tok = model_dir
    args = GRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, beta=0.0,
                      per_device_train_batch_size=4, num_generations=4)  # fmt: skip
    ds = Dataset.from_dict({"prompt": ["S F"] * 4})
    with pytest.raises(ValueError, match="beta > 0"):
        ActFocusGRPOTrainer(model=str(path), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                            args=args, train_dataset=ds, processing_class=tok)  # fmt: skip

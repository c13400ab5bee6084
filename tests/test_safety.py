"""Numerical faults: a NaN loss or an update that breaks the weights is skipped, counted in
`train/skipped_steps`, and the weights stay finite (rolled back to the last good state)."""

import math

import torch

from tokenergy.safety import Snapshot, params_are_finite, step_is_finite

torch.set_num_threads(1)


def test_step_checks_and_snapshot_restore():
    assert step_is_finite(torch.tensor(1.0), torch.tensor(2.0))
    assert not step_is_finite(torch.tensor(float("nan")), torch.tensor(2.0))
    assert not step_is_finite(torch.tensor(1.0), torch.tensor(float("inf")))
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    snap = Snapshot(model, opt)
    w, step = model.weight.detach().clone(), opt.state_dict()["state"][0]["step"].clone()
    with torch.no_grad():
        model.weight.fill_(float("nan"))
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert not params_are_finite(model)
    snap.restore(model, opt)
    assert torch.equal(model.weight, w) and params_are_finite(model)
    assert torch.equal(opt.state_dict()["state"][0]["step"], step)


def _nan_on_calls(monkeypatch, module, calls):
    """Make ``module.ppo_policy_loss`` return a NaN loss on the given (1-based) calls."""
    real = module.ppo_policy_loss
    count = {"n": 0}

    def patched(*args, **kwargs):
        count["n"] += 1
        loss, metrics = real(*args, **kwargs)
        if count["n"] in calls:
            loss = loss * float("nan")
        return loss, metrics

    monkeypatch.setattr(module, "ppo_policy_loss", patched)


def test_lm_trainer_skips_a_nan_step(monkeypatch):
    import tokenergy.algos.lm as lm
    import tokenergy.algos.update as stage
    from test_lm import tiny_cfg

    _nan_on_calls(monkeypatch, stage, {2})
    cfg = tiny_cfg(**{"algo.iterations": 2, "algo.ent_coef": 0.01})
    result = lm.train_lm(cfg)
    rows = result.history
    assert rows[0]["train/skipped_steps"] == 1 and rows[-1]["train/skipped_steps"] == 1
    assert rows[0]["train/updates"] == cfg.algo.epochs * cfg.algo.minibatches - 1
    assert params_are_finite(result.agent) and math.isfinite(rows[-1]["loss/policy"])


def test_vector_ppo_skips_nan_steps_and_rolls_back_broken_weights(monkeypatch):
    import tokenergy.algos.ppo as ppo
    from test_ppo import small

    _nan_on_calls(monkeypatch, ppo, {1, 3})
    result = ppo.train_ppo(small(**{"ppo.total_steps": 256}))
    assert result.history[-1]["train/skipped_steps"] == 2
    assert params_are_finite(result.model)

    # a finite loss whose update sends the weights to inf: rolled back, counted
    monkeypatch.undo()
    real_step = torch.optim.Adam.step
    count = {"n": 0}

    def bad_step(self, *a, **k):
        out = real_step(self, *a, **k)
        count["n"] += 1
        if count["n"] == 2:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("inf"))
        return out

    monkeypatch.setattr(torch.optim.Adam, "step", bad_step)
    result = ppo.train_ppo(small(**{"ppo.total_steps": 256}))
    assert result.history[-1]["train/skipped_steps"] == 1
    assert params_are_finite(result.model)


def test_one_bad_entry_anywhere_is_caught():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    assert params_are_finite(model)
    for bad in (float("nan"), float("inf"), float("-inf")):
        for p in model.parameters():
            with torch.no_grad():
                saved = p.view(-1)[-1].item()
                p.view(-1)[-1] = bad
            assert not params_are_finite(model)
            with torch.no_grad():
                p.view(-1)[-1] = saved
            assert params_are_finite(model)


def test_a_critic_clipped_apart_leaves_the_policy_step_whole():
    """loss = 0.1·a + 100·b: together, clipping to norm 1 shrinks a's gradient 1000-fold; apart,
    a keeps 0.1 and b is clipped to 1."""
    from tokenergy.safety import guarded_step

    def step(apart: bool) -> tuple[float, float, float]:
        a, b = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
        model = torch.nn.ParameterList([a, b])
        opt = torch.optim.SGD([a, b], lr=1.0)
        norm = guarded_step(
            0.1 * a.sum() + 100.0 * b.sum(), model, opt, [a, b], 1.0, Snapshot(model, opt),
            clip_apart=[[a], [b]] if apart else None,
        )  # fmt: skip
        return -float(a), -float(b), float(norm)

    a_step, b_step, norm = step(apart=False)
    assert math.isclose(norm, math.hypot(0.1, 100.0), rel_tol=1e-6)
    assert math.isclose(a_step, 0.1 / math.hypot(0.1, 100.0), rel_tol=1e-5)
    a_step, b_step, norm = step(apart=True)
    assert math.isclose(a_step, 0.1, rel_tol=1e-6) and math.isclose(b_step, 1.0, rel_tol=1e-6)
    assert math.isclose(norm, 0.1, rel_tol=1e-6)  # the first group's (the policy's) norm

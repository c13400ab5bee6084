"""LM ablations: the plan (shared SFT per env and seed), a small end-to-end ablation with its
report and per-token pictures, and --resume keeping finished runs."""

import pytest
import yaml
from rich.console import Console

from test_lm import tiny_cfg
from tokenergy.config import apply_overrides
from tokenergy.experiments import plan_lm_ablation, run_ablation
from tokenergy.reports.lm import is_lm_ablation, read_samples, write_lm_ablation_report
from tokenergy.runs import RunDirError
from tokenergy.types import Role


def _base(**over):
    return tiny_cfg(
        **{
            "sft.episodes": 8,
            "sft.batch_size": 4,
            "algo.iterations": 2,
            "eval.every": 1,
            "eval.diagnose_seeds": 2,
            "eval.diagnose_group": 2,
            "ablation.variants": {"ppo": {}, "actfocus-ppo": {"energy.weighting": "actfocus"}},
            "ablation.envs": {
                "frozenlake": {},
                "sokoban": {"env.name": "sokoban", "env.kwargs": {"size": 5}},
            },
            **over,
        }
    )


def test_plan_shares_one_sft_agent_per_env_and_seed(tmp_path):
    sft, rl = plan_lm_ablation(_base(), 2, tmp_path)
    assert [s.variant for s in sft] == ["frozenlake/sft"] * 2 + ["sokoban/sft"] * 2
    assert len(rl) == 2 * 2 * 2
    for spec in rl:
        env, variant = spec.variant.split("/")
        k = spec.out.name
        assert spec.cfg.model.path == str(tmp_path / env / "sft" / k / "agent")
        assert spec.cfg.sft.episodes == 0
        assert spec.cfg.env.name == env
        assert spec.cfg.energy.weighting == ("actfocus" if variant == "actfocus-ppo" else "none")
    # the sokoban overrides replace frozenlake's arguments instead of merging into them
    assert rl[-1].cfg.env.kwargs == {"size": 5}
    with pytest.raises(ValueError, match="'sft' names the shared SFT runs"):
        plan_lm_ablation(_base(**{"ablation.variants": {"sft": {}}}), 1, tmp_path)


def test_cells_override_one_env_variant_alone(tmp_path):
    from tokenergy.config import ConfigError

    cells = {"sokoban/actfocus-ppo": {"rollout.keep_groups": 0.5, "energy.beta": 1.0}}
    _, rl = plan_lm_ablation(_base(**{"ablation.cells": cells}), 1, tmp_path)
    got = {s.variant: (s.cfg.rollout.keep_groups, s.cfg.energy.beta) for s in rl}
    assert got == {
        "frozenlake/ppo": (1.0, 0.5),
        "frozenlake/actfocus-ppo": (1.0, 0.5),
        "sokoban/ppo": (1.0, 0.5),
        "sokoban/actfocus-ppo": (0.5, 1.0),  # the variant's weighting kept, the cell's added
    }
    assert rl[-1].cfg.energy.weighting == "actfocus"
    with pytest.raises(ConfigError, match=r"cells\.sokoban/grpo: must name an env"):
        _base(**{"ablation.cells": {"sokoban/grpo": {}}})


def test_small_ablation_report_and_resume(tmp_path):
    out = tmp_path / "abl"
    base = _base(**{"ablation.envs": {"frozenlake": {}}})
    ran = run_ablation(base, 1, out)
    assert len(ran) == 3  # one SFT, two RL runs
    assert is_lm_ablation(out)
    folder, md = write_lm_ablation_report(out)
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert lines[0].startswith("| variant | frozenlake")
    assert [ln.split("|")[1].strip() for ln in lines[1:]] == ["SFT start", "ppo", "actfocus-ppo"]
    for name in ("report.md", "report.html", "curves.png", "diagnose.png"):
        assert (folder / name).is_file()
    report = (folder / "report.md").read_text()
    assert "Peak held-out eval/success" in report  # beside the final step
    assert "Final-step `eval/invalid_rate`" in report and "Final-step `eval/state_exact`" in report
    page = (folder / "report.html").read_text()  # the page shows every section of the report
    for section in ("Peak held-out eval/success", "Peak-to-final drop", "Where the loss weight"):
        assert section in page
    assert page.count("<table>") == sum(ln.startswith("|---") for ln in report.splitlines())
    run = out / "frozenlake" / "actfocus-ppo" / "seed_0"
    tokens = (run / "report" / "tokens.html").read_text()
    assert 'class="obs"' in tokens and 'class="reasoning"' in tokens and "energy" in tokens
    # the page shows the first sample of the first and of the last logged iteration; their
    # action tokens (when the agent wrote an answer span) are marked as such
    samples = read_samples(run)
    its = [x["iteration"] for x in samples]
    shown = [next(x for x in samples if x["iteration"] == it) for it in (min(its), max(its))]
    wrote_answer = any(int(Role.ACTION) in x["roles"] for x in shown)
    assert ('class="action"' in tokens) == wrote_answer
    metrics = (out / "frozenlake" / "ppo" / "seed_0" / "metrics.jsonl").read_text()

    # an SFT agent copied in without its run's metrics still gives a report
    (out / "frozenlake" / "sft" / "seed_0" / "metrics.jsonl").unlink()
    assert write_lm_ablation_report(out)[1] == md
    console = Console(record=True, width=200)
    # everything finished: nothing reruns, and the run says so
    assert run_ablation(base, 1, out, resume=True, console=console) == []
    n = len(list(out.glob("*/*/seed_0/agent")))
    assert f"resume: {n} of {n} runs finished, 0 to train" in console.export_text()
    assert (out / "frozenlake" / "ppo" / "seed_0" / "metrics.jsonl").read_text() == metrics
    # A run saved before a config field existed still counts as finished (the field takes its
    # default), and a variant added to the ablation runs alone.
    saved = out / "frozenlake" / "ppo" / "seed_0" / "config.yaml"
    data = yaml.safe_load(saved.read_text())
    del data["algo"]["critic_warmup_iters"]
    saved.write_text(yaml.safe_dump(data))
    variants = {
        **base.ablation.variants,
        "tau3": {"energy.weighting": "actfocus", "energy.tau": 3.0},
    }
    more = _base(**{"ablation.envs": {"frozenlake": {}}, "ablation.variants": variants})
    assert [s.variant for s in run_ablation(more, 1, out, resume=True)] == ["frozenlake/tau3"]
    changed = apply_overrides(base, {"sft.epochs": 2})
    with pytest.raises(RunDirError, match="different 'sft'"):
        run_ablation(changed, 1, out, resume=True)


def test_only_selects_runs_with_the_sft_runs_they_start_from(tmp_path):
    from tokenergy.experiments import select_runs

    phases = plan_lm_ablation(_base(), 2, tmp_path)
    sft, rl = select_runs(phases, ["sokoban/*"])
    assert [s.variant for s in sft] == ["sokoban/sft"] * 2
    assert sorted({s.variant for s in rl}) == ["sokoban/actfocus-ppo", "sokoban/ppo"]
    sft, rl = select_runs(phases, ["*/actfocus-ppo"])
    assert [(s.variant, s.seed) for s in sft] == [
        ("frozenlake/sft", 0),
        ("frozenlake/sft", 1),
        ("sokoban/sft", 0),
        ("sokoban/sft", 1),
    ]
    assert {s.variant for s in rl} == {"frozenlake/actfocus-ppo", "sokoban/actfocus-ppo"}
    sft, rl = select_runs(phases, ["frozenlake/sft"])  # the SFT runs alone
    assert len(sft) == 2 and rl == []
    sft, rl = select_runs(phases, ["*/ppo/seed_1"])  # one seed folder
    assert [(s.variant, s.out.name) for s in rl] == [
        ("frozenlake/ppo", "seed_1"),
        ("sokoban/ppo", "seed_1"),
    ]
    assert [(s.variant, s.out.name) for s in sft] == [
        ("frozenlake/sft", "seed_1"),
        ("sokoban/sft", "seed_1"),
    ]
    with pytest.raises(ValueError, match="no run of the plan matches"):
        select_runs(phases, ["treasure/*"])


def test_resume_continues_an_unfinished_run_from_its_checkpoint(tmp_path):
    """A run cut off after its checkpoint at iteration 2 of 3 picks up there under --resume and
    ends with the metrics of the run that was never cut off."""
    import shutil

    base = _base(
        **{
            "ablation.envs": {"frozenlake": {}},
            "ablation.variants": {"ppo": {}},
            "algo.iterations": 3,
            "log.checkpoint_every": 2,
            "log.keep_checkpoints": 3,
        }
    )
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    run_ablation(base, 1, straight)
    run_ablation(base, 1, cut)
    run = cut / "frozenlake" / "ppo" / "seed_0"
    shutil.rmtree(run / "agent")
    shutil.rmtree(run / "checkpoints" / "iter_000003")
    assert (run / "checkpoints" / "iter_000002").is_dir()
    (run / "kept").write_text("a run that starts over would clear its folder")
    ran = run_ablation(base, 1, cut, resume=True)
    assert [s.variant for s in ran] == ["frozenlake/ppo"]
    rows = [
        {k: v for k, v in r.items() if not k.startswith("perf/")}
        for r in map(yaml.safe_load, (run / "metrics.jsonl").read_text().splitlines())
    ]
    want = [
        {k: v for k, v in r.items() if not k.startswith("perf/")}
        for r in map(
            yaml.safe_load,
            (straight / "frozenlake" / "ppo" / "seed_0" / "metrics.jsonl").read_text().splitlines(),
        )
    ]
    assert rows == want
    assert (run / "agent").is_dir() and (run / "kept").is_file()


def _fake_run(folder, successes, diag=None, now=None):
    """A finished run folder: held-out success every 10 iterations, an optional ``diag/*`` row
    at the last evaluation and an optional ``report/diagnose_now.json``."""
    import json

    (folder / "agent").mkdir(parents=True)
    rows = [{"train/iteration": 10 * i, "eval/success": v} for i, v in enumerate(successes)]
    if diag is not None:
        rows[-1].update(diag)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if now is not None:
        (folder / "report").mkdir()
        (folder / "report" / "diagnose_now.json").write_text(json.dumps(now))


def _sft_rounds(folder, seen, failed=False):
    """Give a fake SFT run's metrics the gate's rows (state_exact after each round) and its
    iteration-0 evaluation's state_exact (the last round's)."""
    import json

    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    gate = [{"sft/round": i + 1, "sft/state_exact": v} for i, v in enumerate(seen)]
    if len(seen) == 1:
        gate = []  # no gate: no round rows
    rows[0]["eval/state_exact"] = seen[-1]
    rows = gate + ([{"sft/gate_failed": 1.0}] if failed else []) + rows
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _diag(rho_action, p_action, share=0.1):
    return {
        "diag/share_action": share,
        "diag/energy_groups": 32.0,
        "diag/energy_spearman_action": rho_action,
        "diag/energy_p_action": p_action,
        "diag/energy_spearman_reasoning": 0.0,
        "diag/energy_p_reasoning": 1.0,
        "diag/energy_spearman_all": None,  # NaN, as metrics.jsonl writes it
        "diag/energy_p_all": None,
    }


def test_study_report_intervals_drop_and_the_papers_diagnostic(tmp_path):
    """Hand-made runs: the paired difference's 95% interval, the peak-to-final drop, and the
    paper's diagnostic at the SFT start (from `diagnose --now`) and at the final agents (the
    last logged diag row, unless `diagnose --now` measured it)."""
    root = tmp_path / "study"
    root.mkdir()
    (root / "ablation.yaml").write_text(
        yaml.safe_dump({"seeds": 3, "variants": ["ppo", "actfocus-ppo"], "envs": ["sokoban"]})
    )
    ppo = [[0.3, 0.6, 0.5], [0.3, 0.4, 0.4], [0.3, 0.5, 0.6]]
    af = [[0.3, 0.5, 0.6], [0.3, 0.5, 0.45], [0.3, 0.7, 0.55]]
    for k in range(3):
        sft = root / "sokoban" / "sft" / f"seed_{k}"
        _fake_run(sft, [0.3], now=_diag(0.5, 0.01, 0.2))
        gated = [({}, []), ({"min_state_exact": 0.9}, [0.5, 0.95]), ({"min_state_exact": 0.9}, [0.1, 0.3, 0.5])][k]  # fmt: skip
        if gated[0]:
            (sft / "config.yaml").write_text(yaml.safe_dump({"sft": gated[0]}))
        _sft_rounds(sft, gated[1] or [0.92], failed=k == 2)
        _fake_run(root / "sokoban" / "ppo" / f"seed_{k}", ppo[k], diag=_diag(0.1 * k, 0.5))
        _fake_run(
            root / "sokoban" / "actfocus-ppo" / f"seed_{k}",
            af[k],
            diag=_diag(0.9, 0.9),  # overridden by what diagnose --now measured:
            now=_diag([0.3, 0.4, 0.5][k], [0.04, 0.2, 0.001][k]),
        )
    folder, _ = write_lm_ablation_report(root)
    report = (folder / "report.md").read_text()
    # differences 10, 5, -5 points: mean +3.3, sd 7.6, 95% CI 3.33 ± 4.303 * 7.64 / sqrt(3)
    assert (
        "- actfocus-ppo − ppo (final step, points, paired by seed, mean ± std): "
        "sokoban +3.3 ± 7.6, 95% CI -15.6 to +22.3 (2/3 seeds)"
    ) in report
    drop = report.split("Peak-to-final drop")[1].split("\n\n")[1].splitlines()
    assert drop[2] == "| ppo | 0.033 ± 0.058 (n=3) |"  # drops 0.1, 0, 0
    assert drop[3] == "| actfocus-ppo | 0.067 ± 0.076 (n=3) |"  # 0, 0.05, 0.15
    # the SFT agents: success and state_exact at iteration 0, rounds, the gate of each config
    sft_rows = report.split("The SFT agents every variant")[1].split("\n\n")[1].splitlines()
    assert sft_rows[2:] == [
        "| sokoban | seed_0 | 0.300 | 0.920 | 1 | none |",
        "| sokoban | seed_1 | 0.300 | 0.950 | 2 | 0.9: met |",
        "| sokoban | seed_2 | 0.300 | 0.500 | 3 | 0.9: missed |",
    ]
    energy = report.split("The ActFocus paper's diagnostic")[1].split("\n\n")[1].splitlines()
    assert energy[2] == (
        "| sokoban | SFT start | 3 | 32 | +0.500 ± 0.000 (3/3) | +0.000 ± 0.000 (0/3) | — | 0.200 |"
    )
    assert energy[3].startswith("| sokoban | ppo | 3 | 32 | +0.100 ± 0.100 (0/3) |")
    assert energy[4].startswith("| sokoban | actfocus-ppo | 3 | 32 | +0.400 ± 0.100 (2/3) |")
    # the starts come from the first variant with finished runs
    import shutil

    shutil.rmtree(root / "sokoban" / "ppo")
    _, md = write_lm_ablation_report(root)
    assert "| SFT start | 0.300 ± 0.000 |" in md
    for k in range(3):
        _fake_run(root / "sokoban" / "ppo" / f"seed_{k}", ppo[k], diag=_diag(0.1 * k, 0.5))
    # a seed one variant alone has finished is left out of the pairs
    _fake_run(root / "sokoban" / "ppo" / "seed_3", [0.3, 0.9])
    write_lm_ablation_report(root)
    assert (
        "sokoban +3.3 ± 7.6, 95% CI -15.6 to +22.3 (2/3 seeds)"
        in (folder / "report.md").read_text()
    )
    # an SFT agent whose RL runs have not finished yet still counts in the start row (from the
    # SFT runs' own evaluations: 0.3, 0.3, 0.3 and 0.7)
    _fake_run(root / "sokoban" / "sft" / "seed_4", [0.7])
    _, md = write_lm_ablation_report(root)
    assert "| SFT start | 0.400 ± 0.200 |" in md


def test_the_sokoban_study_plans_the_presets_at_the_papers_scale(tmp_path):
    """configs/actfocus-sokoban.yaml plans, for every variant, exactly the run of the preset
    it names with the study's flags (`tokenergy train configs/sokoban-<algo>.yaml
    --rollout.episodes 128 --algo.iterations 200 --algo.lr_final 0 --eval.every 20 ...`), the
    sweeps differing from ActFocus-GRPO in the one field they sweep."""
    from tokenergy.config import config_to_dict, load_config

    base = load_config("configs/actfocus-sokoban.yaml")
    _, rl = plan_lm_ablation(base, 1, tmp_path)
    scale = {"rollout.episodes": 128, "algo.iterations": 200, "algo.lr_final": 0.0,
             "eval.every": 20, "sft.episodes": 0}  # fmt: skip
    af = {"energy.weighting": "actfocus", "algo.loss_normalize": "weights"}
    want = {
        "ppo": ("ppo", {}),
        "grpo": ("grpo", {}),
        "actfocus-ppo": ("ppo", af),
        "actfocus-grpo": ("grpo", af),
        "af-grpo-beta0": ("grpo", {**af, "energy.beta": 0.0}),
        "af-grpo-beta1": ("grpo", {**af, "energy.beta": 1.0}),
        "af-grpo-beta2": ("grpo", {**af, "energy.beta": 2.0}),
        "af-grpo-ref-entropy": ("grpo", {**af, "energy.source": "ref_entropy"}),
        "af-grpo-logprob-shift": ("grpo", {**af, "energy.source": "logprob_shift"}),
        "af-grpo-policy-nll": ("grpo", {**af, "energy.source": "surprisal"}),
        "af-grpo-alpha0.5": ("grpo", {**af, "energy.alpha": 0.5}),
        "af-grpo-alpha1": ("grpo", {**af, "energy.alpha": 1.0}),
    }
    assert [s.variant.split("/")[1] for s in rl] == list(want)
    for spec in rl:
        algo, over = want[spec.variant.split("/")[1]]
        preset = apply_overrides(
            load_config(f"configs/sokoban-{algo}.yaml"),
            {**scale, **over, "model.path": spec.cfg.model.path},
        )
        got, expected = config_to_dict(spec.cfg), config_to_dict(preset)
        for key in ("name", "log", "ablation"):
            got.pop(key), expected.pop(key)
        assert got == expected, spec.variant

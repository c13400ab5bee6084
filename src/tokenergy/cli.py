"""The ``tokenergy`` command line: train, ablate, report, diagnose, eval, play, config.

Config overrides follow the command as ``--section.field VALUE`` (``--ppo.clip-eps 0.1``).
Bad input exits with code 2 and one line naming what is wrong; ``--debug`` (before the
command) shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.table import Table

from tokenergy.config import (
    ConfigError,
    LMRunConfig,
    RunConfig,
    apply_overrides,
    config_to_dict,
    load_config,
    parse_override_args,
)
from tokenergy.runs import RunDirError

__all__ = ["app", "main"]

app = typer.Typer(
    help="tokenergy: RL for small transformer and LM agents, with token-level energy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
_state = {"debug": False}
_OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.callback()
def _root(
    debug: bool = typer.Option(
        False, "--debug", help="Show tracebacks instead of one-line errors."
    ),
) -> None:
    _state["debug"] = debug


def _load(config: Path | None, extra: list[str], **direct: object) -> RunConfig | LMRunConfig:
    if config is not None and str(config).startswith("--"):
        # No preset given: click took the first override's name for the CONFIG argument.
        extra, config = [str(config), *extra], None
    overrides = parse_override_args(extra)
    if "env.id" in direct and _preset_kind(config) == "lm":
        direct["env.name"] = direct.pop("env.id")  # --env names a text env in an lm preset
    overrides.update({k: v for k, v in direct.items() if v is not None})
    return load_config(config, overrides)


def _same_config(given: dict, saved: dict, run_dir: Path, prefix: str = "") -> None:
    """Refuse to resume a run under a config that differs from the one it was started with."""
    for key in sorted(set(given) | set(saved)):
        a, b = given.get(key), saved.get(key)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict) and key != "kwargs":
            _same_config(a, b, run_dir, f"{path}.")
        elif a != b and path != "log.progress":
            raise ValueError(
                f"--resume {run_dir}: {path} is {a!r} in the given config but {b!r} in the run; "
                "resume with the run's own config (omit CONFIG)"
            )


def _preset_kind(config: Path | None) -> str:
    try:
        data = yaml.safe_load(Path(config).read_text()) if config is not None else {}
    except (OSError, yaml.YAMLError):
        return "vector"  # load_config reports the problem with the file
    return (data or {}).get("kind", "vector") if isinstance(data, dict) else "vector"


@app.command(context_settings=_OVERRIDES)
def train(
    ctx: typer.Context,
    config: Path | None = typer.Argument(
        None, help="YAML preset (configs/*.yaml); defaults when omitted."
    ),
    out: Path | None = typer.Option(None, "--out", help="Run folder (default runs/<name>)."),
    env: str | None = typer.Option(
        None,
        "--env",
        help="Gymnasium env id, e.g. CartPole-v1 (sets env.id); in an lm preset the text env (env.name).",
    ),
    seed: int | None = typer.Option(None, "--seed", help="Run seed (sets seed)."),
    device: str | None = typer.Option(
        None, "--device", help="cpu, cuda, cuda:N or auto (sets device)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing run folder."),
    resume: Path | None = typer.Option(
        None,
        "--resume",
        help="Continue this run folder from its newest complete checkpoint (its own config; "
        "a CONFIG given must resolve to the same).",
    ),
    threads: int | None = typer.Option(
        None,
        "--threads",
        min=1,
        help="CPU threads for torch (default: torch's, one per core); give 1 to each of two "
        "runs sharing 2 cores, which otherwise slow each other down several times over.",
    ),
) -> None:
    """Train one run. Extra --section.field VALUE options override the config."""
    from tokenergy.experiments import run_training
    from tokenergy.reports.runs import final_value

    if threads is not None:
        import torch

        torch.set_num_threads(threads)

    if resume is not None:
        cfg = load_config(resume / "config.yaml")
        if config is not None or ctx.args:
            given = _load(config, ctx.args, **{"env.id": env, "seed": seed, "device": device})
            _same_config(config_to_dict(given), config_to_dict(cfg), resume)
        out = resume
    else:
        cfg = _load(config, ctx.args, **{"env.id": env, "seed": seed, "device": device})
        out = out or Path("runs") / cfg.name
    result = run_training(cfg, out, overwrite=overwrite, console=console, resume=resume is not None)
    if os.environ.get("RANK", "0") != "0":  # a data-parallel worker: rank 0 reports
        return
    if cfg.kind == "pipeline":
        _print_summary(result.summary, str(out))
        return
    if cfg.kind == "dfs":
        last = result.history[-1]
        console.print(
            f"done: {len(result.history)} iterations, success {last['rollout/success']:.2f} at "
            f"depth {last['train/depth']}  ->  {out}\nnext: tokenergy search-eval {out}"
        )
        return
    if cfg.kind == "lm":
        first, last_ev = result.evals[0], result.evals[-1]
        console.print(
            f"done: {cfg.algo.iterations} iterations; held-out success "
            f"{first['eval/success']:.2f} after SFT -> {last_ev['eval/success']:.2f}  ->  {out}"
        )
        return
    last = result.history[-1]
    console.print(
        f"done: {last['train/global_step']:,} steps, return {final_value(result.history, 'rollout/return'):+.3f}"
        + (f", success {last['rollout/success']:.2f}" if "rollout/success" in last else "")
        + f"  ->  {out}"
    )


@app.command(context_settings=_OVERRIDES)
def ablate(
    ctx: typer.Context,
    config: Path = typer.Argument(
        ..., help="YAML preset with an ablation section (or the default variants)."
    ),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Seeds per variant (seed, seed+1, ...)."),
    out: Path | None = typer.Option(
        None, "--out", help="Ablation folder (default runs/<name>-ablation)."
    ),
    jobs: int = typer.Option(
        min(2, os.cpu_count() or 1), "--jobs", min=1, help="Runs trained in parallel."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an existing ablation folder."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Keep the finished runs of --out (same config); continue the others from their "
        "newest checkpoint.",
    ),
    only: list[str] = typer.Option(
        None,
        "--only",
        help="Train only the runs whose variant matches (repeat; shell patterns such as "
        "'sokoban/*', '*/ppo' or 'sokoban/ppo/seed_2' for one seed; an LM run's SFT run "
        "comes along).",
    ),
) -> None:
    """Train every variant over seeds, then write the report.

    Vector presets compare ppo, energy and shuffled by default. LM presets run one SFT per
    environment and seed, then every variant's RL phase from that same SFT agent.
    """
    from tokenergy.experiments import run_ablation

    cfg = _load(config, ctx.args)
    out = out or Path("runs") / f"{cfg.name}-ablation"
    n_var = len(cfg.ablation.variants)
    if only:
        from tokenergy.experiments import plan_ablation, plan_lm_ablation, select_runs

        plan = (
            plan_lm_ablation(cfg, seeds, out)
            if cfg.kind == "lm"
            else [plan_ablation(cfg, seeds, out)]
        )
        picked = select_runs(list(plan), only)
        console.print(
            f"ablation: the runs matching {' '.join(only)}: "
            + ", then ".join(f"{len(p)} runs" for p in picked)
            + f", {jobs} in parallel -> {out}"
        )
    elif cfg.kind == "lm":
        n_env = len(cfg.ablation.envs or {cfg.env.name: {}})
        console.print(
            f"ablation: {n_env} envs x {seeds} seeds SFT runs, then {n_env} envs x {n_var} "
            f"variants x {seeds} seeds = {n_env * n_var * seeds} RL runs, {jobs} in parallel -> {out}"
        )
    else:
        console.print(
            f"ablation: {n_var} variants x {seeds} seeds = {n_var * seeds} runs, {jobs} in parallel -> {out}"
        )
    run_ablation(
        cfg, seeds, out, jobs=jobs, overwrite=overwrite, console=console, resume=resume, only=only
    )
    if cfg.kind == "dfs":
        from tokenergy.algos.dfs import ablation_table

        md = ablation_table(out)
        _print_table(md, f"{out}: search-eval of every run (mean ± std over seeds)")
        console.print(f"table: {out / 'search_ablation.md'}, plot: {out / 'search_ablation.png'}")
        return
    _report(out)


@app.command(context_settings=_OVERRIDES)
def pipeline(
    ctx: typer.Context,
    config: Path = typer.Argument(..., help="A pipeline preset, e.g. configs/slm-story.yaml."),
    out: Path | None = typer.Option(None, "--out", help="Run (or grid) folder."),
    sizes: list[str] = typer.Option(
        None, "--size", help="Model sizes of a grid (repeat: --size tiny --size small)."
    ),
    domains: list[str] = typer.Option(
        None, "--domain", help="Domains of a grid (repeat: --domain story --domain news)."
    ),
    seeds: int = typer.Option(1, "--seeds", min=1, help="Seeds per cell (seed, seed+1, ...)."),
    jobs: int = typer.Option(1, "--jobs", min=1, help="Runs trained in parallel (a grid)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing folder."),
    resume: bool = typer.Option(
        False, "--resume", help="A grid: keep the finished runs of --out, train the others."
    ),
) -> None:
    """SFT -> reward model -> PPO on synthetic text: one run, or a sizes x domains x seeds grid.

    One run writes summary.json (reward-model accuracy, SFT and PPO scores, win rate,
    perplexity, Distinct-n); a grid (several --size/--domain values or --seeds > 1) shares one
    pre-training per size and seed and writes table.md and headroom.png.
    """
    from tokenergy.experiments import _finished, plan_pipeline_grid, run_specs, run_training
    from tokenergy.reports.pipeline import grid_table
    from tokenergy.runs import prepare_run_dir

    cfg = _load(config, ctx.args)
    if cfg.kind != "pipeline":
        raise ValueError(f"{config}: kind is {cfg.kind!r}; tokenergy pipeline takes kind: pipeline")
    sizes = sizes or [cfg.model.size]
    domains = domains or [cfg.corpus.domain]
    if len(sizes) == 1 and len(domains) == 1 and seeds == 1:
        one = apply_overrides(cfg, {"model.size": sizes[0], "corpus.domain": domains[0]})
        out = out or Path("runs") / one.name
        result = run_training(one, out, overwrite=overwrite, console=console)
        _print_summary(result.summary, str(out))
        return
    out = out or Path("runs") / f"{cfg.name}-grid"
    pre, runs = plan_pipeline_grid(cfg, sizes, domains, seeds, out)
    if resume and out.is_dir():
        pre, runs = [s for s in pre if not _finished(s)], [s for s in runs if not _finished(s)]
    else:
        prepare_run_dir(out, overwrite)
    console.print(
        f"pipeline grid: {len(sizes)} sizes x {len(domains)} domains x {seeds} seeds = "
        f"{len(sizes) * len(domains) * seeds} runs ({len(pre)} pre-trainings first), "
        f"{jobs} in parallel -> {out}"
    )
    for specs in (pre, runs):
        if specs:
            run_specs(specs, jobs, console)
    md, _ = grid_table(out)
    _print_table(md, f"{out}: held-out, mean ± std over seeds")
    console.print(f"table: {out / 'table.md'}; capacity headroom: {out / 'headroom.png'}")


def _print_summary(summary: dict, where: str) -> None:
    table = Table(title=f"{where}: held-out")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in summary.items():
        table.add_row(k, f"{v:.4g}")
    console.print(table)


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="A run folder or an ablation folder."),
    metric: str | None = typer.Option(
        None, "--metric", help="Threshold metric (default from the config)."
    ),
    threshold: float | None = typer.Option(
        None, "--threshold", help="Threshold value (default from the config)."
    ),
    panel: list[str] | None = typer.Option(
        None,
        "--panel",
        help="A metric to plot (repeat: --panel eval/success --panel eval/state_exact); "
        "default the training curves.",
    ),
) -> None:
    """Learning curves (mean ± std over seeds) and the summary table, as PNG, markdown and HTML.

    LM runs also get per-token pictures (tokens.html: energy, weight and advantage of every
    token) and energy-over-turn curves; LM ablations a success table per environment.
    """
    _report(run_dir, metric, threshold, panel or None)


def _report(
    root: Path,
    metric: str | None = None,
    threshold: float | None = None,
    panels: list[str] | None = None,
) -> None:
    from tokenergy.reports.lm import (
        is_lm_ablation,
        write_diagnose,
        write_lm_ablation_report,
        write_token_report,
    )
    from tokenergy.reports.runs import write_report

    if is_lm_ablation(root):
        folder, md = write_lm_ablation_report(root)
        _print_table(md, f"{root}: final-step held-out success (mean ± std over seeds)")
        console.print(
            f"report: {folder / 'report.html'} (also report.md, curves.png, diagnose.png)"
        )
        for page in sorted(root.glob("*/*/seed_0/report/tokens.html")):
            console.print(f"per-token heatmaps: {page}")
        return
    _print_report(root, write_report(root, metric, threshold, panels))
    tokens = write_token_report(root)
    if tokens is not None:
        console.print(f"per-token pictures: {tokens}")
        try:
            png, _ = write_diagnose(root)
            console.print(f"action-bottleneck diagnostic: {png}")
        except RunDirError:
            pass


def _print_table(md: str, title: str) -> None:
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    table = Table(title=title)
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for ln in lines[2:]:
        table.add_row(*[c.strip() for c in ln.strip("|").split("|")])
    console.print(table)


def _print_report(root: Path, result: tuple[Path, str]) -> None:
    folder, md = result
    _print_table(md, f"{root}")
    console.print(f"report: {folder / 'report.html'} (also report.md, curves.png)")


@app.command("eval")
def eval_cmd(
    run_dir: Path = typer.Argument(..., help="A language-model agent's run folder."),
    episodes: int | None = typer.Option(
        None, "--episodes", min=1, help="Held-out episodes (default from the config)."
    ),
    temperature: float | None = typer.Option(
        None, "--temperature", min=0.0, help="Sampling temperature; 0 is greedy (default)."
    ),
    seed_offset: int | None = typer.Option(
        None, "--seed-offset", min=0, help="First held-out env seed (default from the config)."
    ),
    maps: int | None = typer.Option(
        None,
        "--maps",
        min=0,
        help="Distinct held-out maps the episodes cycle through; 0: one per episode "
        "(default from the config).",
    ),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:N or auto."),
) -> None:
    """Success rate (with its standard error), invalid-action rate, mean turns and tokens of a
    trained agent on held-out seeds."""
    import json
    import math

    from tokenergy.algos.ppo import resolve_device
    from tokenergy.models import load_agent
    from tokenergy.rollout.episodes import eval_settings, evaluate

    cfg = load_config(run_dir / "config.yaml")
    if cfg.kind != "lm":
        raise ValueError(
            f"{str(run_dir)!r} is a {cfg.kind!r} run; eval is for language-model agents"
        )
    agent_dir = run_dir / "agent"
    if not agent_dir.is_dir():
        raise RunDirError(f"{str(agent_dir)!r} not found: the run has not finished")
    agent = load_agent(agent_dir).to(resolve_device(device or cfg.device))
    result = evaluate(agent, cfg, episodes, temperature, seed_offset, maps=maps)
    # what was measured, so that a later reader can tell a greedy eval from a sampled one
    settings = eval_settings(cfg, episodes, temperature, seed_offset, maps)
    n = settings["episodes"]
    # the binomial standard error: two agents' success rates on the same n seeds differ by more
    # than ~2.8 of it before the difference is more than sampling and slip luck
    p = result["eval/success"]
    result["eval/success_se"] = math.sqrt(p * (1.0 - p) / n)
    table = Table(title=f"{run_dir}  ({cfg.env.name}, {n} episodes)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in result.items():
        table.add_row(k, f"{v:.3f}")
    console.print(table)
    (run_dir / "eval.json").write_text(json.dumps({**result, "settings": settings}, indent=2))


@app.command()
def diagnose(
    run_dir: Path = typer.Argument(..., help="A language-model agent's run folder."),
    now: bool = typer.Option(
        False, "--now", help="Measure the final agent now instead of reading diag/* metrics."
    ),
    seeds: int = typer.Option(8, "--seeds", min=1, help="With --now: env seeds."),
    group: int = typer.Option(8, "--group", min=2, help="With --now: rollouts per env seed."),
    reference: Path | None = typer.Option(
        None,
        "--reference",
        help="With --now: the frozen reference agent (e.g. the SFT start) whose free energy "
        "the energy diagnostic reads; without it, the agent's own.",
    ),
) -> None:
    """The action-bottleneck diagnostics. Per role, mean |corr| between the episode return and
    the summed token log-probability across rollouts of one env seed, beside the role's token
    share; and the ActFocus paper's: across env seeds, Spearman's rho (and p) between the std of
    the returns and the mean energy over action, reasoning and all tokens.

    Reads the diag/* metrics the run logged at each evaluation (eval.diagnose_seeds > 0) and
    plots them over training; --now (or a run without them) measures the final agent and
    keeps what it measured in report/diagnose_now.json, which the study report reads.
    """
    import json

    import torch

    from tokenergy.algos.ppo import resolve_device
    from tokenergy.credit.diagnostics import action_bottleneck
    from tokenergy.models import load_agent
    from tokenergy.reports.lm import write_diagnose
    from tokenergy.runs import read_metrics

    cfg = load_config(run_dir / "config.yaml")
    if cfg.kind != "lm":
        raise ValueError(f"{str(run_dir)!r} is a {cfg.kind!r} run; diagnose is for LM agents")
    rows = read_metrics(run_dir)
    if now or not any("diag/share_action" in r for r in rows):
        agent_dir = run_dir / "agent"
        if not agent_dir.is_dir():
            raise RunDirError(f"{str(agent_dir)!r} not found: the run has not finished")
        console.print(f"measuring the final agent: {seeds} env seeds x {group} rollouts")
        device = resolve_device(cfg.device)
        agent = load_agent(agent_dir).to(device)
        ref = None
        if reference is not None:
            ref = load_agent(reference).policy.to(device).eval().requires_grad_(False)
        gen = torch.Generator().manual_seed(cfg.seed)
        res = action_bottleneck(agent, cfg, seeds, group, gen, reference=ref)
        last = max((int(r.get("train/iteration", 0)) for r in rows), default=0)
        rows = [{"train/iteration": last, **res}]
        # kept for the study report (its diagnostic of the final agents), with how it was made
        (run_dir / "report").mkdir(exist_ok=True)
        (run_dir / "report" / "diagnose_now.json").write_text(
            json.dumps(
                {
                    **rows[0],
                    "seeds": seeds,
                    "group": group,
                    "reference": str(reference) if reference is not None else None,
                },
                indent=1,
            )
        )
    png, md = write_diagnose(run_dir, [r for r in rows if "diag/share_action" in r])
    _print_table(md, f"{run_dir}: action bottleneck")
    console.print(f"picture: {png}")


@app.command()
def search(
    run_dir: Path = typer.Argument(..., help="A language-model agent's run folder."),
    algo: str = typer.Option("mcts", "--algo", help="mcts, beam or best_of_n."),
    episodes: int = typer.Option(32, "--episodes", min=1, help="Held-out episodes."),
    simulations: int = typer.Option(64, "--simulations", min=1, help="mcts: simulations per move."),
    c_puct: float = typer.Option(1.5, "--c-puct", min=0.0, help="mcts: exploration constant."),
    width: int = typer.Option(4, "--width", min=1, help="beam: width."),
    c_value: float = typer.Option(1.0, "--c-value", help="beam: weight of the value head."),
    n: int = typer.Option(8, "--n", min=1, help="best_of_n: sampled episodes per seed."),
) -> None:
    """Inference-time search against greedy decoding and sampling, on the same held-out seeds:
    success, return, tokens generated and seconds per episode."""
    import json

    from rich.progress import Progress

    from tokenergy.algos.ppo import resolve_device
    from tokenergy.models import load_agent
    from tokenergy.search import compare

    cfg = load_config(run_dir / "config.yaml")
    if cfg.kind != "lm":
        raise ValueError(f"{str(run_dir)!r} is a {cfg.kind!r} run; search is for LM agents")
    agent_dir = run_dir / "agent"
    if not agent_dir.is_dir():
        raise RunDirError(f"{str(agent_dir)!r} not found: the run has not finished")
    agent = load_agent(agent_dir).to(resolve_device(cfg.device)).eval()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"{algo} on {episodes} seeds", total=episodes)
        rows = compare(
            agent, cfg, algo, episodes, simulations, width, c_value, n, c_puct,
            progress=lambda i, _n: bar.update(task, completed=i),
        )  # fmt: skip
    table = Table(title=f"{run_dir}: {cfg.env.name}, {episodes} held-out seeds")
    for col in ("method", "success", "return", "tokens / episode", "s / episode"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for r in rows:
        table.add_row(
            r["method"], f"{r['success']:.3f}", f"{r['return']:+.3f}",
            f"{r['tokens_per_episode']:,.0f}", f"{r['seconds_per_episode']:.2f}",
        )  # fmt: skip
    console.print(table)
    (run_dir / f"search-{algo}.json").write_text(json.dumps(rows, indent=2))


@app.command("search-eval")
def search_eval(
    run_dir: Path = typer.Argument(..., help="A search transformer's run folder (kind: dfs)."),
    depths: list[int] = typer.Option(
        None,
        "--depths",
        help="Tree depths (repeat: --depths 3 --depths 4); default the run's eval.depths.",
    ),
    episodes: int | None = typer.Option(None, "--episodes", min=1, help="Episodes per depth."),
    greedy: bool = typer.Option(
        False, "--greedy", help="Take the argmax move instead of sampling."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the evaluation goals and samples."),
    hand_set: bool = typer.Option(
        False,
        "--hand-set",
        help="Score the hand-set two-head depth-first construction on the run's task instead "
        "of the trained model (files get a _hand_set suffix).",
    ),
) -> None:
    """Success within the leaf budget, leaves visited against randomized DFS, revisit rate and
    ranked-order share at each depth; attention.png shows what each head reads."""
    from tokenergy.algos.dfs import (
        SearchTransformer,
        attention_picture,
        dfs_weights,
        evaluate_search,
        load_search_model,
        write_search_eval,
    )

    cfg = load_config(run_dir / "config.yaml")
    if cfg.kind != "dfs":
        raise ValueError(f"{str(run_dir)!r} is a {cfg.kind!r} run; search-eval is for kind: dfs")
    if hand_set:
        model = SearchTransformer(cfg.tree.k, heads=2)
        dfs_weights(model, lam=40.0)  # margins of 10+ logits: sampled moves stay depth-first
    else:
        model = load_search_model(run_dir)
    depths = depths or list(cfg.eval.depths)
    t = cfg.tree
    rows = evaluate_search(
        model, t.k, depths, episodes or cfg.eval.episodes, seed=seed, greedy=greedy,
        goal=t.goal, zipf_s=t.zipf_s, gamma=t.gamma,
    )  # fmt: skip
    tag = "_hand_set" if hand_set else ""
    extra = {"greedy": greedy, "seed": seed, "k": t.k, "goal": t.goal, "hand_set": hand_set}
    md = write_search_eval(run_dir, rows, extra, tag)
    what = "hand-set construction" if hand_set else f"trained on depths {list(cfg.train.depths)}"
    _print_table(md, f"{run_dir}: k={t.k}, {t.goal} goals, {what}")
    picture = run_dir / f"attention{tag}.png"
    attention_picture(model, t.k, min(max(depths), 4), picture, seed=seed)
    console.print(f"written: {run_dir / f'search_eval{tag}.md'}, {picture}")


@app.command(context_settings=_OVERRIDES)
def play(
    ctx: typer.Context,
    env: str = typer.Argument(..., help="Text env name: frozenlake, sokoban, sudoku4."),
    seed: int = typer.Option(0, "--seed", help="Level seed."),
) -> None:
    """Play a text env in the terminal. Type a move (e.g. Up), 'solver' for a hint, 'quit' to stop.

    Extra --key VALUE options are the env's arguments (--is-slippery true, --size 7).
    """
    from tokenergy.envs import make
    from tokenergy.envs.text import extract_answer

    kwargs = {k.replace("-", "_"): v for k, v in parse_override_args(ctx.args).items()}
    try:
        game = make(env, **kwargs)
    except TypeError as err:
        raise ValueError(f"{env}: {err}") from None
    obs, _ = game.reset(seed=seed)
    console.print(game.instructions, markup=False)
    total = 0.0
    while True:
        console.print(obs, markup=False)
        try:
            line = input("> ").strip()
        except EOFError:
            break
        if line in ("quit", "exit", "q"):
            break
        if line == "solver":
            console.print(game.solver_turn(), markup=False)
            continue
        text = line if extract_answer(line) is not None else f"<answer> {line} </answer>"
        obs, reward, terminated, truncated, info = game.step(text)
        total += reward
        note = "  (invalid)" if info.get("invalid") else ""
        console.print(f"reward {reward:+.2f}, total {total:+.2f}{note}", markup=False)
        if terminated or truncated:
            console.print(obs, markup=False)
            verdict = "solved" if info.get("success") else "episode over"
            console.print(f"{verdict} after {game.steps} moves, return {total:+.2f}")
            break


@app.command("config", context_settings=_OVERRIDES)
def show_config(
    ctx: typer.Context,
    config: Path | None = typer.Argument(None, help="YAML preset; defaults when omitted."),
) -> None:
    """Print the resolved config (preset + overrides) as YAML, without running anything."""
    cfg = _load(config, ctx.args)
    console.print(
        yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="", markup=False, highlight=False
    )


def main() -> None:
    """Console-script entry point: one-line errors with exit code 2 for bad input."""
    try:
        app(standalone_mode=False)
    except (ConfigError, RunDirError, ValueError, RuntimeError) as err:
        if _state["debug"]:
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as err:  # click's usage errors and friends
        import click

        if isinstance(err, click.exceptions.ClickException):
            err.show()
            sys.exit(err.exit_code)
        raise


if __name__ == "__main__":
    main()

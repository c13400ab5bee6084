"""The ``tokenergy`` command line: train, ablate, report, config.

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
    RunConfig,
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


def _load(config: Path | None, extra: list[str], **direct: object) -> RunConfig:
    if config is not None and str(config).startswith("--"):
        # No preset given: click took the first override's name for the CONFIG argument.
        extra, config = [str(config), *extra], None
    overrides = parse_override_args(extra)
    overrides.update({k: v for k, v in direct.items() if v is not None})
    return load_config(config, overrides)


@app.command(context_settings=_OVERRIDES)
def train(
    ctx: typer.Context,
    config: Path | None = typer.Argument(
        None, help="YAML preset (configs/*.yaml); defaults when omitted."
    ),
    out: Path | None = typer.Option(None, "--out", help="Run folder (default runs/<name>)."),
    env: str | None = typer.Option(
        None, "--env", help="Gymnasium env id, e.g. CartPole-v1 (sets env.id)."
    ),
    seed: int | None = typer.Option(None, "--seed", help="Run seed (sets seed)."),
    device: str | None = typer.Option(
        None, "--device", help="cpu, cuda, cuda:N or auto (sets device)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing run folder."),
) -> None:
    """Train one run. Extra --section.field VALUE options override the config."""
    from tokenergy.experiments import run_training
    from tokenergy.reports import final_value

    cfg = _load(config, ctx.args, **{"env.id": env, "seed": seed, "device": device})
    out = out or Path("runs") / cfg.name
    result = run_training(cfg, out, overwrite=overwrite, console=console)
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
) -> None:
    """Train every variant (default: ppo, energy, shuffled) over seeds, then write the report."""
    from tokenergy.experiments import run_ablation
    from tokenergy.reports import write_report

    cfg = _load(config, ctx.args)
    out = out or Path("runs") / f"{cfg.name}-ablation"
    n = len(cfg.ablation.variants) * seeds
    console.print(
        f"ablation: {len(cfg.ablation.variants)} variants x {seeds} seeds = {n} runs, {jobs} in parallel -> {out}"
    )
    run_ablation(cfg, seeds, out, jobs=jobs, overwrite=overwrite, console=console)
    _print_report(out, write_report(out))


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="A run folder or an ablation folder."),
    metric: str | None = typer.Option(
        None, "--metric", help="Threshold metric (default from the config)."
    ),
    threshold: float | None = typer.Option(
        None, "--threshold", help="Threshold value (default from the config)."
    ),
) -> None:
    """Learning curves (mean ± std over seeds) and the steps-to-threshold table, as PNG, markdown and HTML."""
    from tokenergy.reports import write_report

    _print_report(run_dir, write_report(run_dir, metric, threshold))


def _print_report(root: Path, result: tuple[Path, str]) -> None:
    folder, md = result
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    table = Table(title=f"{root}")
    for h in header:
        table.add_column(h, justify="right" if h != "variant" else "left")
    for ln in lines[2:]:
        table.add_row(*[c.strip() for c in ln.strip("|").split("|")])
    console.print(table)
    console.print(f"report: {folder / 'report.html'} (also report.md, curves.png)")


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

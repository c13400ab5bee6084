"""Run orchestration: one training run with a live progress bar, and ablations over seeds.

An ablation folder holds ``ablation.yaml`` (the base config, variants and seeds) and one run
folder per variant and seed: ``<out>/<variant>/seed_<k>/``. Runs are spread over worker
processes (one torch thread each); a rich progress bar shows every run's live return.
"""

from __future__ import annotations

import concurrent.futures as cf
import fnmatch
import json
import multiprocessing as mp
import os
import queue as queue_mod
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from tokenergy.algos.ppo import resolve_device, train_ppo
from tokenergy.config import RunConfig, apply_overrides, config_to_dict, load_config
from tokenergy.distributed import Parallel
from tokenergy.runs import Run, RunDirError, latest_checkpoint, prepare_run_dir

__all__ = [
    "RunSpec",
    "plan_ablation",
    "plan_lm_ablation",
    "plan_pipeline_grid",
    "run_ablation",
    "run_specs",
    "run_training",
]


def _progress_bar(console: Console | None = None) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description:<18}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


def _status(row: dict[str, float]) -> str:
    parts = []
    if "ppo/score" in row:
        parts.append(f"RM score {row['ppo/score']:+.2f}  KL {row['ppo/kl_ref']:.3f}")
    if "rm/accuracy" in row:
        parts.append(f"RM accuracy {row['rm/accuracy']:.2f}")
    if "win_rate" in row:
        parts.append(f"Δ {row['delta']:+.2f}  win rate {row['win_rate']:.2f}")
    if "eval/success" in row:
        parts.append(f"eval success {row['eval/success']:.2f}")
    if "rollout/return" in row:
        parts.append(f"return {row['rollout/return']:+.3f}")
    if "rollout/success" in row:
        parts.append(f"success {row['rollout/success']:.2f}")
    if "perf/sps" in row:
        parts.append(f"{row['perf/sps']:,.0f} sps")
    return "  ".join(parts)


def _trainer(cfg: Any) -> tuple[Any, int]:
    """The training function for a config's kind, and its number of progress steps."""
    if getattr(cfg, "kind", "vector") == "lm":
        from tokenergy.algos.lm import train_lm

        return train_lm, cfg.algo.iterations + 1
    if getattr(cfg, "kind", "vector") == "dfs":
        from tokenergy.algos.dfs import train_dfs

        return train_dfs, sum(cfg.train.iterations)
    if getattr(cfg, "kind", "vector") == "pipeline":
        from tokenergy.algos.pipeline import run_pipeline, total_steps

        return run_pipeline, total_steps(cfg)
    return train_ppo, cfg.num_iterations


def run_training(
    cfg: RunConfig,
    out: str | Path,
    overwrite: bool = False,
    console: Console | None = None,
    resume: bool = False,
):
    """Train one run into ``out``, with a progress bar when ``cfg.log.progress`` is on.

    With ``resume`` the run in ``out`` continues from its newest complete checkpoint.
    """
    train, total = _trainer(cfg)
    par = Parallel.from_env(resolve_device(cfg.device))
    if par.enabled and getattr(cfg, "kind", "vector") != "lm":
        raise ValueError(
            f"{par.world} processes: only the LM trainer runs data-parallel; "
            "train vector presets in one process"
        )
    kwargs: dict[str, Any] = {}
    resume_iteration = None
    if resume:
        ckpt = latest_checkpoint(out)
        resume_iteration = int(json.loads((ckpt / "state.json").read_text())["iteration"])
        kwargs["resume"] = ckpt
        if console is not None and par.is_main:
            console.print(f"resuming {out} from {ckpt.name} (iteration {resume_iteration})")
    result = _train_here(cfg, out, train, total, par, overwrite, console, resume_iteration, kwargs)
    par.close()  # every rank waits here until rank 0 has written the run (not after an error:
    return result  # a rank that failed must not wait in a barrier its peers never reach)


def _train_here(cfg, out, train, total, par, overwrite, console, resume_iteration, kwargs):
    if not par.is_main:  # rank 0 writes the run folder
        return train(cfg, None, **kwargs)
    with Run(out, cfg, overwrite=overwrite, resume_iteration=resume_iteration) as run:
        if not cfg.log.progress:
            return train(cfg, run, **kwargs)
        with _progress_bar(console) as bar:
            task = bar.add_task(cfg.name, total=total, status="", completed=resume_iteration or 0)

            def progress(it: int, n: int, step: int, row: dict[str, float]) -> None:
                bar.update(task, completed=it, status=_status(row))

            return train(cfg, run, progress, **kwargs)


@dataclass(frozen=True)
class RunSpec:
    """One run of an ablation."""

    variant: str
    seed: int
    cfg: RunConfig
    out: Path

    @property
    def label(self) -> str:
        return f"{self.variant} s{self.seed}"


def plan_ablation(base: RunConfig, seeds: int, out: str | Path) -> list[RunSpec]:
    """Every (variant, seed) run, configs resolved and validated before anything starts."""
    if seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {seeds}")
    if not hasattr(base, "ablation"):
        raise ValueError(f"ablate: a {base.kind!r} config has no ablation section yet")
    specs = []
    for variant, overrides in base.ablation.variants.items():
        for k in range(seeds):
            cfg = apply_overrides(
                base,
                {
                    **overrides,
                    "seed": base.seed + k,
                    "name": f"{variant}-s{k}",
                    "log.progress": False,
                },
            )
            specs.append(RunSpec(variant, base.seed + k, cfg, Path(out) / variant / f"seed_{k}"))
    return specs


def plan_lm_ablation(base: Any, seeds: int, out: str | Path) -> tuple[list[RunSpec], list[RunSpec]]:
    """The SFT runs (one per env and seed) and the RL runs (per env, variant and seed) of an
    LM ablation. Every variant of an env and seed starts from the same SFT agent, so the
    variants differ only in the RL phase: ``<out>/<env>/sft/seed_<k>`` and
    ``<out>/<env>/<variant>/seed_<k>``.
    """
    if seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {seeds}")
    envs = base.ablation.envs or {base.env.name: {}}
    reserved = {"sft"} & set(base.ablation.variants)
    if reserved:
        raise ValueError("ablation.variants: 'sft' names the shared SFT runs; rename it")
    sft_specs, rl_specs = [], []
    for env_label, env_overrides in envs.items():
        env_base = apply_overrides(base, env_overrides)
        for k in range(seeds):
            seed = base.seed + k
            sft_out = Path(out) / env_label / "sft" / f"seed_{k}"
            sft_cfg = apply_overrides(
                env_base,
                {
                    "seed": seed,
                    "name": f"{env_label}-sft-s{k}",
                    "algo.iterations": 0,
                    "log.progress": False,
                },
            )
            sft_specs.append(RunSpec(f"{env_label}/sft", seed, sft_cfg, sft_out))
            for variant, overrides in base.ablation.variants.items():
                cfg = apply_overrides(
                    env_base,
                    {
                        **overrides,
                        **base.ablation.cells.get(f"{env_label}/{variant}", {}),
                        "seed": seed,
                        "name": f"{env_label}-{variant}-s{k}",
                        "model.path": str(sft_out / "agent"),
                        "model.pretrained": None,
                        "sft.episodes": 0,
                        "log.progress": False,
                    },
                )
                rl_specs.append(
                    RunSpec(
                        f"{env_label}/{variant}",
                        seed,
                        cfg,
                        Path(out) / env_label / variant / f"seed_{k}",
                    )
                )
    return sft_specs, rl_specs


def _resume_point(spec: RunSpec) -> tuple[Path, int] | None:
    """The newest checkpoint of an unfinished run of ``spec`` and its iteration, when the
    run wrote one under the plan's config (else ``None``: the run starts over). Only the vector
    and LM trainers resume; the others always start over."""
    if getattr(spec.cfg, "kind", "vector") not in ("vector", "lm"):
        return None
    if not (spec.out / "checkpoints").is_dir() or not (spec.out / "config.yaml").is_file():
        return None
    try:
        ckpt = latest_checkpoint(spec.out)
    except RunDirError:
        return None
    saved = config_to_dict(load_config(spec.out / "config.yaml"))
    planned = config_to_dict(spec.cfg)
    if any(saved.get(k) != planned.get(k) for k in planned if k not in ("log", "name", "ablation")):
        return None
    return ckpt, int(json.loads((ckpt / "state.json").read_text())["iteration"])


def _worker(spec: RunSpec, q: Any, start: tuple[Path, int] | None = None) -> str:
    """Train one run in this process (one torch thread); from ``start``, a checkpoint of
    the same run and its iteration, when given, else in a fresh folder."""
    torch.set_num_threads(1)  # one core per run; parallelism comes from the processes

    def progress(it: int, n: int, step: int, row: dict[str, float]) -> None:
        q.put((spec.label, it, n, _status(row)))

    train, _ = _trainer(spec.cfg)
    if start is not None:
        ckpt, iteration = start
        with Run(spec.out, spec.cfg, resume_iteration=iteration) as run:
            train(spec.cfg, run, progress, resume=ckpt)
        return spec.label
    with Run(spec.out, spec.cfg, overwrite=True) as run:  # a fresh folder or an unfinished run
        train(spec.cfg, run, progress)
    return spec.label


_POOL_QUEUE: Any = None  # a pool worker's progress queue (set by _init_pool_worker)


def _init_pool_worker(q: Any, parent: int) -> None:
    """Set up a pool worker: the queue its progress goes to, and a watch that ends it when
    the process that started the pool is gone (killed by a signal, its workers would otherwise
    train on as orphans)."""
    global _POOL_QUEUE
    _POOL_QUEUE = q

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _pool_worker(spec: RunSpec, start: tuple[Path, int] | None) -> str:
    return _worker(spec, _POOL_QUEUE, start)


def run_ablation(
    base: RunConfig,
    seeds: int,
    out: str | Path,
    jobs: int = 1,
    overwrite: bool = False,
    console: Console | None = None,
    resume: bool = False,
    only: list[str] | None = None,
) -> list[RunSpec]:
    """Train every variant over ``seeds`` seeds into ``out``; returns the specs that ran.

    An LM ablation runs in two phases: the shared SFT runs, then the RL runs from them.
    With ``resume`` the runs of ``out`` that finished are kept (their config must match the
    plan's, else a :class:`RunDirError` names the run and field) and an unfinished run
    continues from its newest checkpoint (or starts over when it wrote none).
    ``only`` keeps the runs whose variant matches one of its shell patterns (``sokoban/*``,
    ``*/ppo``), with the SFT runs they start from: a study in pieces.
    """
    lm = getattr(base, "kind", "vector") == "lm"
    phases = list(plan_lm_ablation(base, seeds, out)) if lm else [plan_ablation(base, seeds, out)]
    if only:
        phases = select_runs(phases, only)
    if resume and Path(out).is_dir():
        root = Path(out)
        planned = sum(len(specs) for specs in phases)
        phases = [[s for s in specs if not _finished(s)] for specs in phases]
        left = sum(len(specs) for specs in phases)
        if console is not None:
            console.print(f"resume: {planned - left} of {planned} runs finished, {left} to train")
    else:
        root = prepare_run_dir(out, overwrite)
    meta = {"seeds": seeds, "variants": list(base.ablation.variants)}
    if lm:
        meta["envs"] = list(base.ablation.envs or {base.env.name: {}})
    (root / "ablation.yaml").write_text(
        yaml.safe_dump({**meta, "base": config_to_dict(base)}, sort_keys=False)
    )
    for specs in phases:
        if specs:
            _run_specs(specs, jobs, console, resume=resume)
    return [s for specs in phases for s in specs]


def select_runs(phases: list[list[RunSpec]], patterns: list[str]) -> list[list[RunSpec]]:
    """The runs of ``phases`` whose variant, or variant and seed folder (``sudoku4/grpo/seed_2``),
    matches a pattern, and the runs an LM ablation's selected RL runs start from (the SFT run of
    their env and seed, in the first phase)."""

    def chosen(spec: RunSpec) -> bool:
        names = (spec.variant, f"{spec.variant}/{spec.out.name}")
        return any(fnmatch.fnmatchcase(name, p) for p in patterns for name in names)

    *firsts, last = phases
    kept_last = [s for s in last if chosen(s)]
    if not firsts:
        if not kept_last:
            raise ValueError(f"--only {' '.join(patterns)}: no run of the plan matches")
        return [kept_last]
    needed = {(s.variant.split("/")[0], s.seed) for s in kept_last}
    kept_first = [s for s in firsts[0] if chosen(s) or (s.variant.split("/")[0], s.seed) in needed]
    if not kept_first and not kept_last:
        raise ValueError(f"--only {' '.join(patterns)}: no run of the plan matches")
    return [kept_first, kept_last]


def _finished(spec: RunSpec) -> bool:
    """Whether ``spec.out`` holds this run, finished; a finished run under another config is
    an error (resuming must not mix two plans in one table)."""
    if getattr(spec.cfg, "kind", "vector") == "lm":
        done = (spec.out / "agent").is_dir()
    elif getattr(spec.cfg, "kind", "vector") == "dfs":
        done = (spec.out / "model.pt").is_file()
    elif getattr(spec.cfg, "kind", "vector") == "pipeline":
        done = (spec.out / "summary.json").is_file()
    else:
        ckpt = latest_checkpoint(spec.out) if (spec.out / "checkpoints").is_dir() else None
        done = (
            ckpt is not None
            and int(json.loads((ckpt / "state.json").read_text())["iteration"])
            >= spec.cfg.num_iterations
        )
    if not done:
        return False
    # Read back through the config classes, so fields added since the run got their defaults.
    saved = config_to_dict(load_config(spec.out / "config.yaml"))
    planned = config_to_dict(spec.cfg)
    # An SFT run is reused by RL runs whatever their RL and evaluation settings.
    keys = ["env", "model", "sft", "seed"] if spec.variant.endswith("/sft") else planned
    if spec.variant.endswith("/pretrain"):  # shared by the domains: what it trains, only
        keys = ["model", "pretrain", "seed"]
    for key in keys:
        # log, name and the ablation section itself do not change what a run trains
        if key not in ("log", "name", "ablation") and saved.get(key) != planned.get(key):
            raise RunDirError(
                f"--resume: {spec.out} was trained with a different {key!r} "
                f"({saved.get(key)!r}, plan: {planned.get(key)!r}); use another --out"
            )
    return True


def run_specs(specs: list[RunSpec], jobs: int, console: Console | None) -> None:
    """Train ``specs`` (fresh folders), ``jobs`` at a time, one progress bar per run."""
    _run_specs(specs, jobs, console)


def _run_specs(
    specs: list[RunSpec], jobs: int, console: Console | None, resume: bool = False
) -> None:
    starts = {s.label: _resume_point(s) if resume else None for s in specs}
    with _progress_bar(console) as bar:
        tasks = {
            s.label: bar.add_task(
                s.label,
                total=_trainer(s.cfg)[1],
                status="queued",
                completed=starts[s.label][1] if starts[s.label] else 0,
            )
            for s in specs
        }

        def drain(q: Any) -> None:
            while True:
                try:
                    label, it, _n, status = q.get_nowait()
                except queue_mod.Empty:
                    return
                bar.update(tasks[label], completed=it, status=status)

        if jobs <= 1:
            immediate = _Immediate(
                lambda item: bar.update(tasks[item[0]], completed=item[1], status=item[3])
            )
            for spec in specs:
                _worker(spec, immediate, starts[spec.label])
        else:
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            with cf.ProcessPoolExecutor(
                jobs, ctx, initializer=_init_pool_worker, initargs=(q, os.getpid())
            ) as pool:
                futures = [pool.submit(_pool_worker, spec, starts[spec.label]) for spec in specs]
                pending = set(futures)
                while pending:
                    done, pending = cf.wait(pending, timeout=0.2)
                    drain(q)
                    for fut in done:
                        fut.result()  # re-raise a worker's error here
                drain(q)


class _Immediate:
    """A queue stand-in that handles each item at once (in-process runs)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def put(self, item: Any) -> None:
        self.fn(item)


def plan_pipeline_grid(
    base: Any, sizes: list[str], domains: list[str], seeds: int, out: str | Path
) -> tuple[list[RunSpec], list[RunSpec]]:
    """The runs of a sizes × domains × seeds table, in two phases: one pre-training per size
    and seed (``<out>/pretrain/<size>/seed_<k>``), then every domain's SFT → RM → PPO from it
    (``<out>/<size>/<domain>/seed_<k>``). Configs are resolved and validated here."""
    if seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {seeds}")
    out = Path(out)
    pre, runs = [], []
    for size in sizes:
        for k in range(seeds):
            seed = base.seed + k
            common = {"model.size": size, "seed": seed, "log.progress": False}
            shared = base.model.path is None and base.pretrain.steps > 0
            pre_out = out / "pretrain" / size / f"seed_{k}"
            if shared:
                cfg = apply_overrides(
                    base, {**common, "stop_after": "pretrain", "name": f"pretrain-{size}-s{k}"}
                )
                pre.append(RunSpec(f"{size}/pretrain", seed, cfg, pre_out))
            for domain in domains:
                over = {**common, "corpus.domain": domain, "name": f"{size}-{domain}-s{k}"}
                if shared:
                    over["model.path"] = str(pre_out / "pretrained")
                cfg = apply_overrides(base, over)
                runs.append(
                    RunSpec(f"{size}/{domain}", seed, cfg, out / size / domain / f"seed_{k}")
                )
    return pre, runs

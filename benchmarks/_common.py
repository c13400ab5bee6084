"""Shared helpers of the benchmark scripts: machine description, RESULTS.md appends, and
running a ``tokenergy`` command with its output in a log."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
ROOT = Path(__file__).resolve().parent.parent


def tokenergy() -> list[str]:
    """The command prefix that runs this checkout's CLI with this interpreter."""
    return [sys.executable, "-m", "tokenergy.cli"]


def run_logged(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` (one torch thread) with its output in ``log``; print it as it starts, raise
    on failure, write its wall seconds to ``log`` + ``.seconds`` and return them."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    print("$ tokenergy " + " ".join(shlex.quote(c) for c in cmd[3:]), flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        res = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"failed ({res.returncode}); see {log}")
    seconds = time.perf_counter() - t0
    Path(f"{log}.seconds").write_text(f"{seconds:.1f}\n")
    return seconds


def run_for_result(cmd: list[str], env: dict[str, str], what: str) -> dict:
    """Run ``cmd`` with ``env`` and return the JSON that it prints on its ``RESULT `` line
    (``what`` names the run in the error when there is none)."""
    import json

    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{what} failed:\n{out.stderr[-3000:]}")


def run_in_checkout(args: list[str], worktree: str | Path) -> dict:
    """Run ``python <args>`` with the ``tokenergy`` of another checkout (``worktree``, e.g. a
    ``git worktree`` of the commit to compare with) first on the path; return the JSON that the
    child prints on its ``RESULT `` line."""
    env = {**os.environ, "PYTHONPATH": str(Path(worktree).resolve() / "src")}
    return run_for_result([sys.executable, *args], env, f"the run in {worktree}")


def machine() -> str:
    import gymnasium
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} logical cores; Python {platform.python_version()}, "
        f"torch {torch.__version__}, gymnasium {gymnasium.__version__}"
    )


def command() -> str:
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


def append_results(title: str, body: str) -> None:
    """Append one dated section (title, command, machine, body) to benchmarks/RESULTS.md."""
    if not RESULTS.exists():
        RESULTS.write_text(
            "# Benchmark results\n\nEach section is appended by the script named in it.\n"
        )
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    with RESULTS.open("a") as f:
        f.write(
            f"\n## {title} ({stamp})\n\n- command: `{command()}`\n- machine: {machine()}\n\n{body}\n"
        )
    print(f"appended to {RESULTS}")


def scripted_success(run_dir: Path, turn) -> float:
    """Success of ``turn(env) -> text`` (the scripted solver, a random mover) on the held-out
    episodes the run's evaluation plays (its ``eval.episodes``, ``seed_offset`` and ``maps``)."""
    from tokenergy.config import load_config
    from tokenergy.envs import make
    from tokenergy.rollout.episodes import eval_seeds

    cfg = load_config(run_dir / "config.yaml")
    wins = 0
    for seed in eval_seeds(cfg.eval.episodes, cfg.eval.seed_offset, cfg.eval.maps):
        env = make(cfg.env.name, **cfg.env.kwargs)
        env.reset(seed=seed)
        for _ in range(cfg.env.max_turns):
            *_, term, trunc, info = env.step(turn(env))
            if term or trunc:
                wins += bool(info["success"])
                break
    return wins / cfg.eval.episodes

"""PPO on CartPole-v1: steps until the mean return of the last 10 episodes reaches 475, per seed.

Usage: python benchmarks/cartpole_ppo.py [--seeds 3] [--steps 100000]
Runs the seeds in parallel (one process and one torch thread each), prints a table and
appends it to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import append_results

CONFIG = Path(__file__).parent.parent / "configs" / "cartpole.yaml"


def one_seed(args: tuple[int, int]) -> dict:
    import torch

    torch.set_num_threads(1)
    from tokenergy.algos.ppo import train_ppo
    from tokenergy.config import load_config
    from tokenergy.reports.runs import steps_to_threshold

    seed, steps = args
    cfg = load_config(CONFIG, {"seed": seed, "ppo.total_steps": steps, "log.progress": False})
    t0 = time.perf_counter()
    hist = train_ppo(cfg).history
    wall = time.perf_counter() - t0
    return {
        "seed": seed,
        "solved_at": steps_to_threshold(hist, "rollout/return", 475.0),
        "best": max(r.get("rollout/return", 0.0) for r in hist),
        "final": hist[-1].get("rollout/return", float("nan")),
        "sps": hist[-1]["train/global_step"] / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    with mp.get_context("spawn").Pool(a.jobs) as pool:
        rows = pool.map(one_seed, [(s, a.steps) for s in range(a.seeds)])
    lines = [
        "| seed | steps to mean-10 return ≥ 475 | best mean-10 return | final mean-10 return | steps/s (1 thread) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        solved = "never" if r["solved_at"] is None else f"{r['solved_at']:,}"
        lines.append(
            f"| {r['seed']} | {solved} | {r['best']:.1f} | {r['final']:.1f} | {r['sps']:,.0f} |"
        )
    n_solved = sum(r["solved_at"] is not None for r in rows)
    summary = (
        f"{n_solved}/{len(rows)} seeds reach 475 within {a.steps:,} steps; median steps/s "
        f"{statistics.median(r['sps'] for r in rows):,.0f} ({a.jobs} runs in parallel, config {CONFIG.name})."
    )
    table = "\n".join(lines) + "\n\n" + summary
    print(table)
    append_results("PPO on CartPole-v1", table)


if __name__ == "__main__":
    main()

"""The bottleneck-gridworld ablation at 5 seeds: PPO vs energy-weighted PPO vs shuffled control.

Usage: python benchmarks/bottleneck_ablation.py [--seeds 5] [--out runs/bottleneck-5seeds]
Runs `tokenergy ablate configs/bottleneck.yaml`, writes its report, and appends the table to
benchmarks/RESULTS.md. The README's numbers come from this script.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import append_results

CONFIG = Path(__file__).parent.parent / "configs" / "bottleneck.yaml"


def main() -> None:
    from tokenergy.config import load_config
    from tokenergy.experiments import run_ablation
    from tokenergy.reports.runs import write_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="runs/bottleneck-5seeds")
    a = ap.parse_args()
    cfg = load_config(CONFIG)
    t0 = time.perf_counter()
    run_ablation(cfg, a.seeds, a.out, jobs=a.jobs, overwrite=True)
    wall = time.perf_counter() - t0
    folder, table = write_report(a.out)
    per_seed = (Path(folder) / "report.md").read_text().split("Steps to threshold per seed", 1)[1]
    per_seed = per_seed.split("Means and stds", 1)[0].split(":", 1)[1].strip()
    body = (
        f"{table}\n\nPer seed:\n\n{per_seed}\n\n{cfg.ppo.total_steps:,} steps per run, "
        f"{a.seeds} seeds, {a.jobs} runs in parallel, {wall:.0f} s in all; report in `{folder}`."
    )
    print(body)
    append_results("Bottleneck gridworld ablation", body)


if __name__ == "__main__":
    main()

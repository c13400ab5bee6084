"""The ActFocus study: PPO, GRPO, ActFocus-PPO, ActFocus-GRPO, down-weighting only,
redistribution only and the shuffled control on slippery FrozenLake, Sokoban and Sudoku 4x4.

Usage: python benchmarks/actfocus_ablation.py [--seeds 3] [--jobs 2] [--out runs/actfocus-ablation]
[--doc docs/results/actfocus] [--report-only] [-- extra tokenergy overrides]

Runs ``tokenergy ablate configs/actfocus.yaml`` (with ``--resume``, so an interrupted study
continues where it stopped), then copies its report into ``--doc``: ``README.md`` (the table,
the diagnostic, the command and the machine), the curve and diagnostic pictures, and the
per-token heatmaps of one PPO and one ActFocus-PPO run per environment.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="runs/actfocus-ablation")
    ap.add_argument("--doc", default="docs/results/actfocus")
    ap.add_argument("--report-only", action="store_true", help="only rewrite --doc from --out")
    a, extra = ap.parse_known_args()
    extra = [x for x in extra if x != "--"]
    out, doc = ROOT / a.out, ROOT / a.doc
    cmd = [sys.executable, "-m", "tokenergy.cli", "ablate", "configs/actfocus.yaml",
           "--seeds", str(a.seeds), "--jobs", str(a.jobs), "--out", str(out), "--resume", *extra]  # fmt: skip
    t0 = time.perf_counter()
    if not a.report_only:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        print("$ " + " ".join(shlex.quote(c) for c in cmd[2:]), flush=True)
        subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    else:
        subprocess.run([sys.executable, "-m", "tokenergy.cli", "report", str(out)], check=True,
                       cwd=ROOT, stdout=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - t0

    doc.mkdir(parents=True, exist_ok=True)
    report = out / "report"
    for name in ("curves.png", "diagnose.png"):
        shutil.copy(report / name, doc / name)
    text = (report / "report.md").read_text()
    pages = []
    for env_dir in sorted(p for p in out.iterdir() if (p / "sft").is_dir()):
        for variant in ("ppo", "actfocus-ppo"):
            page = env_dir / variant / "seed_0" / "report" / "tokens.html"
            if page.is_file():
                name = f"tokens-{env_dir.name}-{variant}.html"
                shutil.copy(page, doc / name)
                pages.append(f"- [{env_dir.name}, {variant}]({name})")
    # The report's own list of token pages points into the run folders; the copies are here.
    text = text.split("Per-token pictures:")[0].rstrip()
    argv = " ".join(shlex.quote(x) for x in sys.argv[1:] if x != "--report-only")
    command = f"python benchmarks/actfocus_ablation.py {argv}".strip()
    head = f"- command: `{command}`\n- machine: {machine()}\n"
    if not a.report_only and wall > 60:  # a resumed study that trained nothing says nothing
        head += f"- wall time of this invocation: {wall / 60:.0f} min\n"
    body = text.replace("# LM ablation: ", "# ActFocus ablation: ", 1)
    title, _, rest = body.partition("\n")
    (doc / "README.md").write_text(
        f"{title}\n\n{head}{rest}\n\nPer-token heatmaps (open in a browser; hover a token for "
        "its numbers):\n\n" + "\n".join(pages) + "\n"
    )
    print(f"wrote {doc}")


if __name__ == "__main__":
    main()

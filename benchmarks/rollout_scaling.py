"""Rollout throughput against the batch size: agent tokens per second from 16 to 512 episodes,
optionally beside another checkout.

Usage: python benchmarks/rollout_scaling.py [--sizes tiny small] [--batches 16 64 128 256 512]
[--env sokoban] [--repeats 2] [--threads 2] [--device cpu] [--baseline WORKTREE]

Each cell is ``tokenergy.rollout.rollout`` of a randomly initialised agent (which writes full
48-token turns, so every batch does the same work per episode) on the env of
``configs/<env>-ppo.yaml`` with its model (grid embeddings included), 5 turns, sampled at
temperature 1; the median of ``--repeats`` after a warm-up. ``--baseline`` runs the same cells
with the ``tokenergy`` of another checkout (a ``git worktree``) in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import ROOT, append_results, run_in_checkout


def rates(a: argparse.Namespace) -> dict[str, dict[str, float]]:
    """``{size: {batch: agent tokens/s}}`` with the ``tokenergy`` imported here."""
    import torch
    import yaml

    from tokenergy.envs import make
    from tokenergy.models import build_agent
    from tokenergy.rollout import collate, rollout

    torch.set_num_threads(a.threads)
    preset = yaml.safe_load((ROOT / "configs" / f"{a.env}-ppo.yaml").read_text())
    kwargs = preset["env"].get("kwargs", {})
    grid = bool(preset["model"].get("grid", False))
    out: dict[str, dict[str, float]] = {}
    for size in a.sizes:
        agent = build_agent(size, seed=0, grid=grid).eval().to(a.device)
        out[size] = {}
        for batch in a.batches:
            times, tokens = [], 0
            for r in range(a.repeats + 1):  # the first warms up
                envs = [make(a.env, **kwargs) for _ in range(batch)]
                t0 = time.perf_counter()
                eps = rollout(agent.policy, agent.tokenizer, envs, list(range(batch)),
                              max_turns=5, max_turn_tokens=48,
                              generator=torch.Generator().manual_seed(r))  # fmt: skip
                if a.device.startswith("cuda"):
                    torch.cuda.synchronize()
                if r:
                    times.append(time.perf_counter() - t0)
                    tokens = int(collate(eps, agent.tokenizer.pad_token_id).mask.sum())
            out[size][str(batch)] = tokens / statistics.median(times)
            print(f"{size} {batch}: {out[size][str(batch)]:,.0f} agent tok/s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--batches", nargs="+", type=int, default=[16, 64, 128, 256, 512])
    ap.add_argument("--env", default="sokoban")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--baseline", default=None, help="a worktree of the commit to compare with")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(rates(a)))
        return
    ours = rates(a)
    base = None
    if a.baseline:
        base = run_in_checkout(
            [
                __file__, "--child", "--sizes", *a.sizes,
                "--batches", *map(str, a.batches), "--env", a.env, "--repeats", str(a.repeats),
                "--threads", str(a.threads), "--device", a.device,
            ],
            a.baseline,
        )  # fmt: skip
    head = "| model | " + " | ".join(f"{b} episodes" for b in a.batches) + " |"
    lines = [head, "|---|" + "---|" * len(a.batches)]
    for size in a.sizes:
        cells = []
        for b in a.batches:
            r = ours[size][str(b)]
            cell = f"{r:,.0f}"
            if base:
                cell += f" ({base[size][str(b)]:,.0f}; {r / base[size][str(b)]:.1f}×)"
            cells.append(cell)
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    body = "\n".join(lines) + (
        f"\n\nAgent tokens per second of rollout, {a.env} (its preset's env and model), 5 turns "
        f"of up to 48 tokens, random-init agents, median of {a.repeats}; {a.threads} torch "
        f"threads, device {a.device}"
        + (f"; in brackets the checkout at {a.baseline} and the speed-up" if base else "")
        + ".\n\n`python benchmarks/rollout_scaling.py "
        + " ".join(sys.argv[1:])
        + "`"
    )
    print(body)
    append_results(f"Rollout throughput by batch size ({a.env}, {a.device})", body)


if __name__ == "__main__":
    main()

"""What ActFocus adds to the wall time of a PPO iteration (same config, same batch sizes).

Usage: python benchmarks/actfocus_overhead.py [--size tiny] [--iterations 6] [--repeats 3]
[--threads 2] [--device cpu]

Trains the same randomly initialised agent (which writes full-length turns, so every
iteration processes the same number of tokens) with ``energy.weighting none`` and with
the paper's ``actfocus`` (energy ``ref_free_energy``, the loss divided by the weights' sum),
alternating the two ``--repeats`` times. Reports the
median iteration time (rollout + scoring + energy + update; evaluation excluded) and the
median per-token time, the peak memory of each run (a fresh process per run: resident set on
CPU, allocated device memory on CUDA), and the relative differences. The reference forward whose
logits' logsumexp ``ref_free_energy`` reads is already part of PPO with a KL penalty, so the
energy's logsumexp and the weighting are what is measured.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import append_results


def _cfg(a: argparse.Namespace, weighting: str):
    from tokenergy.config import config_from_dict

    return config_from_dict(
        {
            "kind": "lm",
            "device": a.device,
            "env": {"name": a.env, "max_turns": 6},
            "model": {"size": a.size},
            "sft": {"episodes": 0},
            "rollout": {"episodes": 32, "max_turn_tokens": 40},
            "algo": {
                "name": "ppo",
                "iterations": a.iterations,
                "kl_coef": 0.02,
                "loss_normalize": "weights" if weighting == "actfocus" else "mask",
            },
            "energy": {"source": "ref_free_energy", "weighting": weighting},
            "eval": {"episodes": 1, "every": 10_000},
            "log": {"tensorboard": False, "progress": False},
        }
    )


def one_run(job: tuple[argparse.Namespace, str]) -> tuple[list[dict], float]:
    """One training run in this (fresh) process: its history and its peak memory in MB."""
    import torch

    from tokenergy.algos.lm import train_lm

    a, weighting = job
    torch.set_num_threads(a.threads)
    if a.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    history = train_lm(_cfg(a, weighting)).history
    if a.device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return history, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--env", default="sokoban")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()

    times: dict[str, list[float]] = {"none": [], "actfocus": []}
    per_ktok: dict[str, list[float]] = {"none": [], "actfocus": []}
    peaks: dict[str, list[float]] = {"none": [], "actfocus": []}
    ctx = mp.get_context("spawn")
    for _ in range(a.repeats):
        for weighting in ("none", "actfocus"):
            with ctx.Pool(1, maxtasksperchild=1) as pool:
                history, peak = pool.apply(one_run, ((a, weighting),))
            peaks[weighting].append(peak)
            for row in history[1:]:  # the first iteration warms caches up
                t = row["perf/rollout_s"] + row["perf/update_s"]
                times[weighting].append(t)
                per_ktok[weighting].append(1000 * t / (row["rollout/tokens"] * 32))
    med = {k: statistics.median(v) for k, v in times.items()}
    med_tok = {k: statistics.median(v) for k, v in per_ktok.items()}
    over = 100 * (med["actfocus"] / med["none"] - 1)
    over_tok = 100 * (med_tok["actfocus"] / med_tok["none"] - 1)
    mem = {k: statistics.median(v) for k, v in peaks.items()}
    over_mem = 100 * (mem["actfocus"] / mem["none"] - 1)
    what = "allocated device" if a.device.startswith("cuda") else "resident"
    body = (
        f"| weighting | iteration s (median) | s per 1k tokens (median) | peak {what} MB |\n"
        "|---|---|---|---|\n"
        f"| none (PPO) | {med['none']:.3f} | {med_tok['none']:.4f} | {mem['none']:.0f} |\n"
        f"| actfocus | {med['actfocus']:.3f} | {med_tok['actfocus']:.4f} | {mem['actfocus']:.0f} |\n\n"
        f"ActFocus overhead: {over:+.1f}% per iteration, {over_tok:+.1f}% per token, "
        f"{over_mem:+.1f}% peak memory. "
        f"model {a.size}, env {a.env}, 32 episodes x up to 6 turns x 40 tokens, "
        f"{a.iterations - 1} timed iterations x {a.repeats} alternating repeats, "
        f"{a.threads} torch threads, device {a.device}."
    )
    print(body)
    append_results(f"ActFocus overhead on a PPO iteration ({a.size}, {a.device})", body)


if __name__ == "__main__":
    main()

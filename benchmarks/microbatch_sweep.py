"""The micro-batch sizes of one PPO iteration: rows per forward chunk in the update
(``forward_by_length``'s ``rows_per_chunk``) and rows per chunk of the scoring pass (``score``'s
``batch_size``), swept on the paper's batch (128 Sokoban trajectories of up to 5 turns) from the
committed SFT agent (``agents/sokoban-sft``, the preset ``configs/sokoban-ppo.yaml``: a separate
critic, 2 epochs of 4 minibatches).

Usage: python benchmarks/microbatch_sweep.py [--iterations 3] [--threads 2] [--repeats 2]

Each setting trains ``--iterations`` iterations from the same agent and seed and reports the
medians of all but the first (warm-up); the whole sweep runs ``--repeats`` times, alternating
settings, so a slow minute of the machine does not fall on one setting alone.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import ROOT, append_results

SETTINGS = [(8, 32), (16, 32), (32, 32), (8, 64), (8, 128), (16, 64)]  # (update rows, score rows)


def iteration(rows: int, score_rows: int, a: argparse.Namespace) -> dict[str, float]:
    """Median rollout, scoring and update seconds of the preset's iteration at these sizes."""
    import torch
    import yaml

    import tokenergy.algos.lm as lm
    import tokenergy.algos.update as stage
    from tokenergy.config import config_from_dict

    scoring = importlib.import_module("tokenergy.rollout.score")
    torch.set_num_threads(a.threads)
    raw = yaml.safe_load((ROOT / "configs" / "sokoban-ppo.yaml").read_text())
    raw["model"] = {**raw["model"], "path": str(ROOT / "agents" / "sokoban-sft")}
    raw["env"]["max_turns"] = 5
    raw["sft"] = {"episodes": 0}
    raw["rollout"]["episodes"] = 128
    raw["algo"]["iterations"] = a.iterations
    raw["algo"]["critic_warmup_iters"] = 0  # time the policy update too
    raw["eval"] = {"episodes": 1, "every": 10_000}
    raw["log"] = {"tensorboard": False, "progress": False}
    chunk_defaults = stage.forward_by_length.__defaults__
    score_fn = scoring.score.__wrapped__  # under torch.no_grad
    score_defaults = score_fn.__defaults__
    try:
        stage.forward_by_length.__defaults__ = (*chunk_defaults[:-1], rows)
        score_fn.__defaults__ = (score_rows, *score_defaults[1:])
        history = lm.train_lm(config_from_dict(raw)).history[1:]
    finally:
        stage.forward_by_length.__defaults__ = chunk_defaults
        score_fn.__defaults__ = score_defaults

    def med(key: str) -> float:
        return statistics.median(r[key] for r in history)

    score = med("perf/score_s")
    return {"rollout": med("perf/rollout_s"), "score": score,
            "update": med("perf/update_s") - score}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    times: dict[tuple[int, int], list[dict[str, float]]] = {s: [] for s in SETTINGS}
    for _ in range(a.repeats):
        for rows, score_rows in SETTINGS:
            t = iteration(rows, score_rows, a)
            times[(rows, score_rows)].append(t)
            print(f"update rows {rows:3d}, scoring rows {score_rows:3d}: " + ", ".join(
                f"{k} {v:.2f} s" for k, v in t.items()), flush=True)  # fmt: skip
    lines = ["| update rows per chunk | scoring rows per chunk | scoring s | update s | "
             "scoring + update s |", "|---|---|---|---|---|"]  # fmt: skip
    for (rows, score_rows), ts in times.items():
        s = statistics.median(t["score"] for t in ts)
        u = statistics.median(t["update"] for t in ts)
        lines.append(f"| {rows} | {score_rows} | {s:.2f} | {u:.2f} | {s + u:.2f} |")
    body = "\n".join(lines) + (
        f"\n\nOne PPO iteration of 128 Sokoban trajectories from `agents/sokoban-sft` "
        f"(configs/sokoban-ppo.yaml: separate critic, 2 epochs × 4 minibatches); medians over "
        f"{a.repeats} alternating sweeps of {a.iterations - 1} timed iterations each; "
        f"{a.threads} torch threads. The defaults are 8 and 32.\n"
    )
    append_results("PPO iteration: micro-batch sizes of the update and the scoring pass", body)


if __name__ == "__main__":
    main()

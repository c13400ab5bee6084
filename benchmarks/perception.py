"""Do SFT agents read their observation? One SFT run per row, then the held-out perception
(``eval/state_exact``, ``eval/state_tokens``) and success of the agent it made, beside a random
policy and the scripted solver on the same held-out seeds.

Usage: python benchmarks/perception.py [--rows NAME ...] [--seeds 3 --seeds-rows NAME ...]
[--jobs 2] [--out runs/perception] [--doc docs/results/perception.md] [--resume] [--list]

Each row is ``tokenergy train PRESET --algo.iterations 0`` with the row's overrides (printed as
it starts; one torch thread each, ``--jobs`` at a time); the evaluation after SFT is the run's
own, greedy on 512 held-out levels for every row. ``--resume`` keeps the rows whose run folder already
holds its agent. The table goes to ``--doc`` with this command.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, run_logged, scripted_success, tokenergy

SOKOBAN = "configs/sokoban-ppo.yaml"
FROZENLAKE = "configs/frozenlake-ppo.yaml"

# name -> (preset, what the row tries, overrides). Each row names its data amount and position
# scheme itself, so a row means the same when a preset changes.
SOK_1K = ["--sft.episodes", "1024"]
SOK_4K = ["--sft.episodes", "4096"]
FL_2K = ["--sft.episodes", "2048"]
NO_GRID = ["--model.grid", "false"]
GRID = ["--model.grid", "true"]
ROWS: dict[str, tuple[str, str, list[str]]] = {
    "sok-rope-1k": (SOKOBAN, "RoPE only, 1024 episodes", [*SOK_1K, *NO_GRID]),
    "sok-gpt2-1k": (
        SOKOBAN,
        "learned absolute positions (gpt2), 1024 episodes",
        [*SOK_1K, *NO_GRID, "--model.arch", "gpt2"],
    ),
    "sok-grid-256": (
        SOKOBAN,
        "row / column embeddings, 256 episodes",
        ["--sft.episodes", "256", *GRID],
    ),
    "sok-grid-1k": (SOKOBAN, "row / column embeddings, 1024 episodes", [*SOK_1K, *GRID]),
    "sok-grid-1k-16ep": (
        SOKOBAN,
        "row / column embeddings, 1024 episodes, 16 epochs",
        [*SOK_1K, *GRID, "--sft.epochs", "16"],
    ),
    "sok-grid-1k-small": (
        SOKOBAN,
        "row / column embeddings, 1024 episodes, small model",
        [*SOK_1K, *GRID, "--model.size", "small"],
    ),
    "sok-rope-coords-1k": (
        SOKOBAN,
        "RoPE only, coordinates in the observation, 1024 episodes",
        [*SOK_1K, *NO_GRID, "--env.kwargs.observation", "coords"],
    ),
    "sok-rope-4k": (SOKOBAN, "RoPE only, 4096 episodes", [*SOK_4K, *NO_GRID]),
    "sok-grid-4k": (
        SOKOBAN,
        "row / column embeddings, 4096 episodes (the preset)",
        [*SOK_4K, *GRID],
    ),
    "fl-rope-2k": (
        FROZENLAKE,
        "RoPE only, coordinates observation, 2048 episodes (the preset)",
        [*FL_2K, *NO_GRID],
    ),
    "fl-grid-2k": (
        FROZENLAKE,
        "row / column embeddings, coordinates observation, 2048 episodes",
        [*FL_2K, *GRID],
    ),
    "fl-grid-plain-2k": (
        FROZENLAKE,
        "row / column embeddings, plain grid observation, 2048 episodes",
        [*FL_2K, *GRID, "--env.kwargs.observation", "grid"],
    ),
    "fl-rope-plain-2k": (
        FROZENLAKE,
        "RoPE only, plain grid observation, 2048 episodes",
        [*FL_2K, *NO_GRID, "--env.kwargs.observation", "grid"],
    ),
    "fl-paper-rope-4k": (
        FROZENLAKE,
        "the paper's maps (start and goal anywhere), RoPE only, coordinates, 4096 episodes",
        ["--sft.episodes", "4096", *NO_GRID, "--env.kwargs.layout", "random"],
    ),
    "fl-paper-grid-4k": (
        FROZENLAKE,
        "the paper's maps, row / column embeddings, coordinates, 4096 episodes",
        ["--sft.episodes", "4096", *GRID, "--env.kwargs.layout", "random"],
    ),
}


# The table's demonstrations: one move in ten random (the Sokoban presets now train RL from
# noisier demonstrations, 0.5; a row means the same when a preset changes).
DEMOS = ["--sft.epsilon", "0.1"]
# Every row is scored the same way, whatever its preset's evaluation: greedy, 512 held-out
# levels, each its own.
EVAL = ["--eval.episodes", "512", "--eval.temperature", "0", "--eval.maps", "0"]
COLUMNS = ("eval/state_exact", "eval/state_tokens", "eval/solver_agreement", "eval/success")


def run_dir(out: Path, name: str, seed: int) -> Path:
    """Seed 0 of a row lives in ``out/ROW``, seed s in ``out/ROW-sS``."""
    return out / (name if seed == 0 else f"{name}-s{seed}")


def sft_row(name: str, seed: int, out: Path, resume: bool) -> dict:
    """SFT the row's agent for ``seed`` (kept with ``resume`` when its folder holds one) and
    read the evaluation after SFT from its metrics."""
    preset, _, overrides = ROWS[name]
    d = run_dir(out, name, seed)
    timing = d.with_suffix(".json")
    if not (resume and timing.is_file() and (d / "agent").is_dir()):
        cmd = [*tokenergy(), "train", preset, "--algo.iterations", "0", "--out", str(d)]
        cmd += ["--overwrite", *DEMOS, *overrides, *EVAL, "--seed", str(seed)]
        timing.write_text(json.dumps({"seconds": run_logged(cmd, d.with_suffix(".log"))}))
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x]
    ev = next(r for r in rows if "eval/success" in r)
    return {"name": name, **json.loads(timing.read_text()), **{k: ev[k] for k in COLUMNS}}


def reference_success(run_dir: Path) -> tuple[float, float]:
    """Success of a uniformly random move each turn and of the scripted solver, on the run's
    held-out seeds."""
    import numpy as np

    from tokenergy.envs.text import format_turn

    rng = np.random.default_rng(0)
    rnd = scripted_success(
        run_dir, lambda env: format_turn(env.reasoning(), [env.random_action(rng)])
    )
    return rnd, scripted_success(run_dir, lambda env: env.solver_turn())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("runs/perception"))
    p.add_argument("--doc", type=Path, default=Path("docs/results/perception.md"))
    p.add_argument("--resume", action="store_true")
    p.add_argument("--seeds", type=int, default=1, help="seeds of the rows in --seeds-rows")
    p.add_argument(
        "--seeds-rows", nargs="+", default=None, help="rows run on --seeds seeds (default: all)"
    )
    p.add_argument("--list", action="store_true", help="print the rows and stop")
    args = p.parse_args()
    if args.list:
        for name, (preset, what, ov) in ROWS.items():
            print(f"{name:18s} {preset:30s} {what}  {' '.join(ov)}")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    many = set(args.rows if args.seeds_rows is None else args.seeds_rows)
    jobs = [(n, s) for n in args.rows for s in range(args.seeds if n in many else 1)]
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        futures = {j: pool.submit(sft_row, *j, args.out, args.resume) for j in jobs}
        done = {j: f.result() for j, f in futures.items()}
    lines = [
        "| row | preset | what is tried | seeds | state_exact | state_tokens | solver agreement "
        "| success | SFT + eval time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(rs: list[dict], key: str) -> str:
        xs = [r[key] for r in rs]
        if len(xs) == 1:
            return f"{xs[0]:.3f}"
        each = " / ".join(f"{x:.3f}" for x in xs)
        return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f} ({each})"

    presets_seen: dict[str, Path] = {}
    for n in args.rows:
        preset, what, _ = ROWS[n]
        rs = [r for (name, _), r in done.items() if name == n]
        presets_seen.setdefault(preset, args.out / n)
        minutes = statistics.mean(r["seconds"] for r in rs) / 60
        lines.append(
            f"| {n} | {Path(preset).stem} | {what} | {len(rs)} | {cell(rs, 'eval/state_exact')} | "
            f"{cell(rs, 'eval/state_tokens')} | {cell(rs, 'eval/solver_agreement')} | "
            f"{cell(rs, 'eval/success')} | {minutes:.1f} min |"
        )
    lines += ["", "| preset | random policy | scripted solver |", "|---|---|---|"]
    for preset, d in presets_seen.items():
        rnd, sol = reference_success(d)
        lines.append(f"| {Path(preset).stem} | {rnd:.3f} | {sol:.3f} |")
    cmd = " ".join(shlex.quote(a) for a in ["python", *sys.argv])
    body = "\n".join(lines)
    print(body)
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(
        "# Perception after SFT\n\n"
        f"`{cmd}` ({machine()}).\n\n"
        "Held-out evaluation of each SFT agent, greedy, on 512 held-out levels; "
        "`state_exact` is the share of turns whose scratchpad states the true state word for "
        "word, `state_tokens` the share of its words right, position by position, `solver "
        "agreement` the share whose first move is the scripted solver's "
        "([docs/metrics.md](../metrics.md)); over several seeds, mean ± std (each seed). Time "
        "is the wall time of one run on one core (SFT data, training and the evaluation), "
        "averaged over seeds.\n\n" + body + "\n"
    )


if __name__ == "__main__":
    main()

"""Does RL raise held-out success over the SFT start? SFT once per env and seed, then PPO and
GRPO from that same SFT agent; greedy success on the same held-out env seeds before and after.

Usage: python benchmarks/lm_sft_rl.py [--envs sokoban frozenlake] [--algos ppo grpo]
[--seeds 3] [--jobs 2] [--out runs/lm-results] [--doc docs/results/lm-sft-rl.md]
[--report-only] [--resume] [-- extra tokenergy overrides, e.g. --algo.iterations 20]

Every run is a plain ``tokenergy train`` command (printed as it starts), one torch thread each,
``--jobs`` at a time; a seed's RL runs start as soon as its SFT agent is saved. Writes the table
and a curve plot to ``docs/results/``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, run_logged, scripted_success, tokenergy


def minutes(run_dir: Path) -> float:
    """Wall minutes of the training command that made ``run_dir`` (NaN when not recorded)."""
    path = Path(f"{run_dir.with_suffix('.log')}.seconds")
    return float(path.read_text()) / 60 if path.is_file() else float("nan")


Job = tuple[list[str], Path]


def run_all(first: list[Job], then: dict[int, list[Job]], n: int, resume: bool = False) -> None:
    """Run the ``(command, log)`` jobs ``n`` at a time: every job of ``first``, and each job of
    ``then[i]`` as soon as ``first[i]`` has finished (an RL run needs its own SFT agent, not all
    of them). The first failure stops the script. With ``resume``, a job whose run folder (the
    log's path without ``.log``) already holds its saved ``agent/`` is kept as it is."""

    def done(j: Job) -> bool:
        return resume and (j[1].with_suffix("") / "agent").is_dir()

    with cf.ThreadPoolExecutor(n) as pool:
        # All of ``first`` is queued before any job that waits on it, so a waiting job only ever
        # holds a slot while the job it waits for runs in another: no deadlock.
        pre = [pool.submit(lambda j=j: None if done(j) else run_logged(*j)) for j in first]
        post = [
            pool.submit(lambda i=i, j=j: (pre[i].result(), None if done(j) else run_logged(*j)))
            for i, jobs in then.items()
            for j in jobs
        ]
        for f in pre + post:
            f.result()


def evals(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return [
        (int(r["train/iteration"]), float(r["eval/success"])) for r in rows if "eval/success" in r
    ]


def greedy_success(run_dir: Path, episodes: int, reuse: bool) -> float:
    """Greedy success of the run's agent on ``episodes`` held-out seeds. With ``reuse`` a stored
    eval.json counts only when it was made with these settings (a user's own ``tokenergy eval``
    may have replaced it)."""
    path = run_dir / "eval.json"
    want = {"episodes": episodes, "temperature": 0.0}
    if reuse and path.is_file():
        stored = json.loads(path.read_text())
        if all(stored.get("settings", {}).get(k) == v for k, v in want.items()):
            return stored["eval/success"]
    cmd = [*tokenergy(), "eval", str(run_dir), "--temperature", "0", "--episodes", str(episodes)]
    run_logged(cmd, run_dir.with_suffix(".eval.log"))
    return json.loads(path.read_text())["eval/success"]


def solver_success(run_dir: Path) -> float:
    """The scripted solver's success on the run's held-out env seeds (the reference ceiling)."""
    return scripted_success(run_dir, lambda env: env.solver_turn())


def mean_std(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3f} ± {sd:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", nargs="+", default=["sokoban", "frozenlake"])
    ap.add_argument("--algos", nargs="+", default=["ppo", "grpo"])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="runs/lm-results")
    ap.add_argument("--doc", default="docs/results/lm-sft-rl.md")
    ap.add_argument(
        "--report-only", action="store_true", help="rewrite the table and plot from --out"
    )
    ap.add_argument(
        "--resume", action="store_true", help="keep the runs of --out that finished (agent/ saved)"
    )
    a, extra = ap.parse_known_args()
    extra = [x for x in extra if x != "--"]
    out = Path(a.out)
    t0 = time.perf_counter()

    def job(preset: str, d: Path, seed: int, *fixed: str) -> tuple[list[str], Path]:
        # The extra overrides come first, so the script's own settings win over them.
        d.parent.mkdir(parents=True, exist_ok=True)
        cmd = [*tokenergy(), "train", f"configs/{preset}.yaml", *extra, "--seed", str(seed),
               *fixed, "--out", str(d), "--overwrite", "--log.progress", "false"]  # fmt: skip
        return cmd, d.with_suffix(".log")

    # ---- SFT once per env and seed (0 RL iterations) -----------------------------------------
    sft_jobs = [
        job(f"{env}-ppo", out / env / "sft" / f"seed_{s}", s, "--algo.iterations", "0")
        for env in a.envs
        for s in range(a.seeds)
    ]

    # ---- RL from each SFT agent, started as soon as that agent is saved --------------------
    def rl_job(env: str, algo: str, s: int) -> Job:
        sft_agent = out / env / "sft" / f"seed_{s}" / "agent"
        return job(
            f"{env}-{algo}", out / env / algo / f"seed_{s}", s,
            "--model.path", str(sft_agent), "--sft.episodes", "0",
        )  # fmt: skip

    then = {
        i: [rl_job(env, algo, s) for algo in a.algos]
        for i, (env, s) in enumerate((env, s) for env in a.envs for s in range(a.seeds))
    }
    if not a.report_only:
        run_all(sft_jobs, then, a.jobs, a.resume)
    wall = time.perf_counter() - t0

    # ---- greedy success of each SFT start and each RL agent (same held-out seeds) ----------
    # As many episodes as the RL runs evaluate.
    from tokenergy.config import load_config

    # The evaluations that are not stored run --jobs at a time, like the training runs.
    episodes: dict[Path, int] = {}  # run folder -> held-out seeds to play
    for env in a.envs:
        for s in range(a.seeds):
            n = load_config(out / env / a.algos[0] / f"seed_{s}" / "config.yaml").eval.episodes
            for stage in ["sft", *a.algos]:
                episodes[out / env / stage / f"seed_{s}"] = n
    with cf.ThreadPoolExecutor(a.jobs) as pool:
        futures = {
            d: pool.submit(greedy_success, d, n, a.report_only or a.resume)
            for d, n in episodes.items()
        }
    greedy = {d: f.result() for d, f in futures.items()}

    # ---- table and picture ----------------------------------------------------------------
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [
        "| env | algo | after SFT | final | peak | Δ final (mean ± std over seeds) | seeds "
        "improved | gap to the solver closed (final) | greedy: after SFT | greedy: final | "
        "scripted solver | SFT / RL minutes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    per_seed = []
    fig, axes = plt.subplots(1, len(a.envs), figsize=(5 * len(a.envs), 3.6), squeeze=False)
    for ax, env in zip(axes[0], a.envs, strict=True):
        solver = solver_success(out / env / a.algos[0] / "seed_0")
        for algo, color in zip(a.algos, ["tab:blue", "tab:orange", "tab:green"], strict=False):
            before, after, peak = [], [], []
            curves = []
            for s in range(a.seeds):
                ev = evals(out / env / algo / f"seed_{s}")
                before.append(ev[0][1])
                after.append(ev[-1][1])
                peak.append(max(v for _, v in ev))
                curves.append(ev)
                per_seed.append(
                    f"- {env} {algo} seed {s}: " + ", ".join(f"{it}: {v:.3f}" for it, v in ev)
                )
            deltas = [y - x for x, y in zip(before, after, strict=True)]
            better = sum(d > 0 for d in deltas)
            closed = [d / max(solver - x, 1e-9) for d, x in zip(deltas, before, strict=True)]
            g_before = [greedy[out / env / "sft" / f"seed_{s}"] for s in range(a.seeds)]
            g_after = [greedy[out / env / algo / f"seed_{s}"] for s in range(a.seeds)]
            sft_min = statistics.mean(
                minutes(out / env / "sft" / f"seed_{s}") for s in range(a.seeds)
            )
            rl_min = statistics.mean(
                minutes(out / env / algo / f"seed_{s}") for s in range(a.seeds)
            )
            lines.append(
                f"| {env} | {algo} | {mean_std(before)} | {mean_std(after)} | "
                f"{mean_std(peak)} | {mean_std(deltas)} | {better}/{a.seeds} | "
                f"{mean_std(closed)} | {mean_std(g_before)} | {mean_std(g_after)} | "
                f"{solver:.3f} | {sft_min:.0f} / {rl_min:.0f} |"
            )
            its = [it for it, _ in curves[0]]
            ys = [[v - c[0][1] for _, v in c] for c in curves]  # change from the SFT start
            mean = [statistics.mean(col) for col in zip(*ys, strict=True)]
            sd = [statistics.stdev(col) if len(col) > 1 else 0.0 for col in zip(*ys, strict=True)]
            ax.plot(its, mean, color=color, label=algo, marker="o")
            ax.fill_between(
                its,
                [m - d for m, d in zip(mean, sd, strict=True)],
                [m + d for m, d in zip(mean, sd, strict=True)],
                color=color,
                alpha=0.2,
            )
        ax.set_title(f"{env}: held-out success minus the SFT start's")
        ax.set_xlabel("RL iteration (0 = SFT start)")
        ax.axhline(0.0, color="gray", lw=0.8)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    doc = Path(a.doc)
    doc.parent.mkdir(parents=True, exist_ok=True)
    png = doc.with_suffix(".png")
    fig.savefig(png, dpi=110)
    # the command that made the runs
    argv = [x for x in sys.argv[1:] if x not in ("--report-only", "--resume")]
    cmdline = "python benchmarks/lm_sft_rl.py " + " ".join(shlex.quote(x) for x in argv)
    text = (
        "# SFT, then PPO / GRPO: held-out success before and after RL\n\n"
        f"- command: `{cmdline.strip()}`\n- machine: {machine()}\n"
        f"- {a.seeds} seeds; each seed's SFT agent is the start of both algorithms; success is "
        "measured on the same held-out env seeds before and after RL, with the config's "
        "evaluation temperature (the curves and the first columns) and greedy (last columns)\n"
        + (
            ""
            if a.report_only or a.resume
            else f"- wall time: {wall / 60:.0f} min, {a.jobs} runs at a time, one torch thread each\n"
        )
        + "\n"
        + "\n".join(lines)
        + f"\n\n![held-out success over RL iterations]({png.name})\n\nPer seed (iteration: success):\n\n"
        + "\n".join(per_seed)
        + "\n"
    )
    doc.write_text(text)
    print("\n".join(lines))
    print(f"wrote {doc} and {png}")


if __name__ == "__main__":
    main()

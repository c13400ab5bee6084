"""Same numbers before and after a change: short fixed-seed runs of every trainer, compared
row by row (``perf/*`` aside) with another checkout of the repo or with the golden files.

    python benchmarks/same_numbers.py --baseline /tmp/base    # a worktree of the earlier commit
    python benchmarks/same_numbers.py --write-golden          # refresh tests/golden/*.jsonl

Each case runs through the CLI (one torch thread), so the comparison does not depend on where
the code lives inside the package. With ``--baseline`` both checkouts run on this machine in
this hour and must agree exactly; the golden files guard the numbers from one commit to the
next with a tolerance (``tests/test_same_numbers.py``), since floats differ between CPU kinds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"

_LM_SMALL = [
    "--sft.episodes", "64", "--sft.batch_size", "8", "--sft.epochs", "3", "--sft.lr", "0.01",
    "--algo.iterations", "2", "--algo.critic_warmup_iters", "0", "--algo.lr", "0.001",
    "--rollout.episodes", "8", "--rollout.max_turn_tokens", "48",
    "--eval.episodes", "8", "--eval.every", "1", "--eval.diagnose_seeds", "0",
    "--log.tensorboard", "false",
]  # fmt: skip

# name -> (CLI arguments after ``tokenergy``; the run folder is appended with --out)
CASES: dict[str, list[str]] = {
    "vector-ppo": [
        "train", "configs/cartpole.yaml", "--ppo.total_steps", "1024", "--ppo.num_steps", "64",
        "--log.tensorboard", "false",
    ],
    "lm-ppo": ["train", "configs/frozenlake-ppo.yaml", *_LM_SMALL],
    "lm-grpo": ["train", "configs/sokoban-grpo.yaml", *_LM_SMALL, "--rollout.group_size", "4"],
    "actfocus-ppo": [
        "train", "configs/frozenlake-ppo.yaml", *_LM_SMALL, "--energy.weighting", "actfocus",
        "--energy.source", "ref_free_energy", "--algo.loss_normalize", "weights",
    ],
    "pipeline": [
        "pipeline", "configs/slm-story.yaml", "--corpus.train_docs", "200",
        "--corpus.heldout_docs", "64", "--corpus.pretrain_docs", "200", "--pretrain.steps", "20",
        "--sft.steps", "20", "--rm.steps", "20", "--ppo.iterations", "2", "--ppo.prompts", "8",
        "--ppo.max_new_tokens", "24", "--eval.prompts", "16", "--eval.pairs", "32",
    ],
    "dfs": ["train", "configs/tree-dfs.yaml", "--train.iterations", "[20, 20]",
            "--train.batch", "32", "--eval.episodes", "32"],
}  # fmt: skip


def cpu_model() -> str:
    """The CPU's kind: its model name, family and model numbers and whether it has AVX-512.
    Sampled runs part between CPU kinds (float rounding flips a token now and then), and a
    virtual machine's model name alone ("AMD EPYC") covers generations whose vector units round
    differently, so golden numbers hold on the kind that wrote them."""
    import platform

    try:
        info: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
        if "model name" in info:
            avx512 = "avx512f" in info.get("flags", "").split()
            return (f"{info['model name']} (family {info.get('cpu family', '?')}, model "
                    f"{info.get('model', '?')}{', avx512' if avx512 else ''})")  # fmt: skip
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numbers(rows: list[dict]) -> list[dict]:
    """A run's metric rows without what measures time rather than learning."""
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def run_case(name: str, src: Path | None = None) -> list[dict]:
    """Run one case with the ``tokenergy`` of ``src`` (a checkout's ``src``; this one when
    ``None``) and return its metric rows (``perf/*`` aside)."""
    env = {**os.environ, "PYTHONPATH": str(src or ROOT / "src")}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / name
        cmd = [sys.executable, "-m", "tokenergy.cli", *CASES[name], "--out", str(out)]
        cmd += ["--threads", "1"] if CASES[name][0] == "train" else []
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{name} failed under {src or ROOT}:\n{done.stderr[-3000:]}")
        lines = (out / "metrics.jsonl").read_text().splitlines()
    return numbers([json.loads(x) for x in lines])


def first_difference(a: list[dict], b: list[dict], rtol: float = 0.0, atol: float = 0.0) -> str:
    """The first place where two runs' rows differ beyond the tolerance, or ``""``."""
    if len(a) != len(b):
        return f"{len(a)} rows against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.keys() != y.keys():
            return f"row {i}: keys {sorted(x.keys() ^ y.keys())} in one run only"
        for k in x:
            u, v = x[k], y[k]
            if isinstance(u, float) or isinstance(v, float):
                if u is None or v is None or abs(u - v) > atol + rtol * abs(v):
                    return f"row {i}: {k} {u!r} against {v!r}"
            elif u != v:
                return f"row {i}: {k} {u!r} against {v!r}"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, help="another checkout of the repo to compare with")
    ap.add_argument("--write-golden", action="store_true", help="rewrite tests/golden/*.jsonl")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="one case (repeat)")
    args = ap.parse_args()
    failed = False
    for name in args.case or list(CASES):
        here = run_case(name)
        if args.write_golden:
            GOLDEN.mkdir(exist_ok=True)
            (GOLDEN / "cpu.txt").write_text(cpu_model() + "\n")
            (GOLDEN / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in here))
        if args.baseline is not None:
            there = run_case(name, args.baseline.resolve() / "src")
            diff = first_difference(here, there)
            failed |= bool(diff)
            print(f"{name:14s} {len(here):3d} rows  " + (f"DIFFER: {diff}" if diff else "same"))
        else:
            print(f"{name:14s} {len(here):3d} rows")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

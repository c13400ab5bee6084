"""Parquet files of Sokoban episodes for verl: one row per env seed, played by the
``tokenergy_text_env`` agent loop (tokenergy.integrations.verl).

    .venv-verl/bin/python examples/verl/make_data.py --out data/sokoban   # train / test parquet

Each row's ``prompt`` is the first observation (verl tokenizes it to size its batches; the
loop rebuilds the prompt from the env), ``agent_name`` selects the loop and ``extra_info``
names the episode. Held-out seeds start at 1,000,000, as in tokenergy's own evaluation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from tokenergy.envs import make
from tokenergy.integrations.verl import AGENT_NAME

ENV_KWARGS = {"size": 6, "num_boxes": 1, "max_steps": 10, "max_actions_per_turn": 2,
              "strict_format": True, "plan_in_reasoning": False, "extra_actions": "drop"}  # fmt: skip


def rows(seeds: range, max_turns: int) -> list[dict]:
    out = []
    for seed in seeds:
        env = make("sokoban", **ENV_KWARGS)
        obs, _ = env.reset(seed=seed)
        out.append(
            {
                "data_source": "tokenergy/sokoban",
                "prompt": [{"role": "user", "content": f"{env.instructions}\n{obs}"}],
                "agent_name": AGENT_NAME,
                "reward_model": {"style": "rule", "ground_truth": ""},
                "extra_info": {
                    "env": "sokoban",
                    "env_kwargs": ENV_KWARGS,
                    "seed": seed,
                    "max_turns": max_turns,
                },
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("data/sokoban"))
    ap.add_argument("--train", type=int, default=8192, help="training env seeds")
    ap.add_argument("--test", type=int, default=512, help="held-out env seeds")
    ap.add_argument("--max-turns", type=int, default=5)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows(range(args.train), args.max_turns)).to_parquet(args.out / "train.parquet")
    held_out = range(1_000_000, 1_000_000 + args.test)
    pd.DataFrame(rows(held_out, args.max_turns)).to_parquet(args.out / "test.parquet")
    print(f"{args.train} training and {args.test} held-out rows in {args.out}")


if __name__ == "__main__":
    main()

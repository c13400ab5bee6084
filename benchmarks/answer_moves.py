"""How many moves do an agent's answers play? For each run folder, its final agent plays the
run's evaluation rooms (``eval.maps`` held-out rooms in turn, ``--episodes`` episodes) at
``--temperature`` (the evaluation's by default), and the share of its answers that play two
or more moves (joined by `` || ``) is printed beside its success.

Usage: python benchmarks/answer_moves.py RUN [RUN ...] [--episodes 256] [--temperature T]

(docs/results/actfocus-sokoban/: the share drifts from run to run in uniform and ActFocus
runs alike.)
"""

from __future__ import annotations

import argparse
import re

import torch

from tokenergy.config import load_config
from tokenergy.envs import make
from tokenergy.models import load_agent
from tokenergy.rollout import rollout
from tokenergy.rollout.episodes import eval_seeds

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| run | answers | share with two or more moves | success |\n|---|---|---|---|")
    for run in args.runs:
        cfg = load_config(f"{run}/config.yaml")
        agent = load_agent(f"{run}/agent").eval()
        seeds = eval_seeds(args.episodes, cfg.eval.seed_offset, cfg.eval.maps)
        envs = [make(cfg.env.name, **cfg.env.kwargs) for _ in seeds]
        temperature = cfg.eval.temperature if args.temperature is None else args.temperature
        with torch.no_grad():
            episodes = rollout(
                agent.policy, agent.tokenizer, envs, seeds, max_turns=cfg.env.max_turns,
                max_turn_tokens=cfg.rollout.max_turn_tokens, temperature=temperature,
                generator=torch.Generator().manual_seed(1),
            )  # fmt: skip
        answers = [a for e in episodes for t in e.turn_texts for a in ANSWER.findall(t)]
        several = sum("||" in a for a in answers) / max(len(answers), 1)
        success = sum(e.success for e in episodes) / len(episodes)
        print(f"| {run} | {len(answers)} | {several:.3f} | {success:.3f} |", flush=True)


if __name__ == "__main__":
    main()

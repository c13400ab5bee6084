"""Which part of the state does an agent's scratchpad get wrong? Field by field.

Plays held-out episodes with an agent (the config's env, rollout temperature and turn limits)
and, at every turn whose env states its state, compares each `` . ``-separated field of the
stated state (FrozenLake: position, goal, the holes next to the player) with the true one.

Usage: python benchmarks/state_fields.py AGENT_FOLDER CONFIG [--episodes 128] [--show 4]
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import torch
import yaml

from tokenergy.config import config_from_dict
from tokenergy.envs.text import TextEnv, stated_state
from tokenergy.models import load_agent
from tokenergy.rollout.episodes import run_episodes

SEED_OFFSET = 1_000_000  # eval.seed_offset: the held-out env seeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("agent")
    ap.add_argument("config")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--show", type=int, default=4, help="wrong turns to print")
    a = ap.parse_args()
    raw = yaml.safe_load(Path(a.config).read_text())
    raw["model"] = {**raw["model"], "path": a.agent}
    raw["sft"] = {"episodes": 0}
    cfg = config_from_dict(raw)
    wrong: collections.Counter[int] = collections.Counter()
    turns, shown, names = 0, 0, []
    perceive = TextEnv.perceive

    def scored(env: TextEnv, text: str):
        nonlocal turns, shown, names
        truth_text = env.state_text()
        if truth_text is not None:
            truth = truth_text.split(" . ")
            said = " ".join(stated_state(text, env.plan_marker)).split(" . ")
            names = [f.split(" :")[0].split(" at ")[0] for f in truth]
            turns += 1
            for k, field in enumerate(truth):
                wrong[k] += k >= len(said) or said[k] != field
            if said != truth and shown < a.show:
                shown += 1
                print(f"said : {' . '.join(said)}\ntruth: {truth_text}\n")
        return perceive(env, text)

    TextEnv.perceive = scored
    try:
        seeds = [SEED_OFFSET + i for i in range(a.episodes)]
        run_episodes(load_agent(a.agent).eval(), cfg, seeds,
                     generator=torch.Generator().manual_seed(0), measure_perception=True)  # fmt: skip
    finally:
        TextEnv.perceive = perceive
    print(f"{turns} turns of {a.episodes} held-out episodes, temperature "
          f"{cfg.rollout.temperature}; share of turns with the field right:")  # fmt: skip
    for k, name in enumerate(names):
        print(f"  field {k + 1} ({name}): {1 - wrong[k] / max(turns, 1):.3f}")


if __name__ == "__main__":
    main()

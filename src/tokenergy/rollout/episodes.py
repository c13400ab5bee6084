"""Playing a config's text env: episodes for training data and evaluation.

:func:`run_episodes` plays the env of an LM config on given seeds with its rollout settings
(the agent writing, or a scripted turn such as :func:`noisy_solver`'s); :func:`evaluate`
plays held-out seeds and returns :func:`episode_stats` (success, invalid rate, turns, tokens,
perception) under the ``eval/`` prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tokenergy.config import LMRunConfig
from tokenergy.distributed import Parallel
from tokenergy.envs import make
from tokenergy.envs.text import TextEnv
from tokenergy.rollout.batch import Trajectories, collate
from tokenergy.rollout.generate import rollout
from tokenergy.types import Role

__all__ = [
    "episode_stats",
    "eval_seeds",
    "eval_settings",
    "evaluate",
    "noisy_solver",
    "run_episodes",
]

_SINGLE = Parallel()


def noisy_solver(epsilon: float, rng: np.random.Generator) -> Callable[[TextEnv], str]:
    """The solver's turn, each of its moves replaced by a random one with probability
    ``epsilon``.

    The scratchpad still states what the solver sees (and its plan, where the env writes
    one), so the noise sits on the action tokens: the SFT policy learns to reason well and
    act imperfectly.
    """
    from tokenergy.envs.text import format_turn

    def turn(env: TextEnv) -> str:
        moves = [
            env.random_action(rng) if rng.random() < epsilon else m for m in env.solver_moves()
        ]
        return format_turn(env.reasoning(), moves)

    return turn


def _envs(cfg: LMRunConfig, n: int) -> list[TextEnv]:
    return [make(cfg.env.name, **cfg.env.kwargs) for _ in range(n)]


def run_episodes(
    agent,
    cfg: LMRunConfig,
    seeds: list[int],
    *,
    temperature: float | None = None,
    generator: torch.Generator | None = None,
    groups: list[int] | None = None,
    turn_fn: Callable[[TextEnv], str] | None = None,
    count_solver_moves: bool = False,
    measure_perception: bool = False,
) -> Trajectories:
    """Episodes of ``cfg``'s env on ``seeds`` with its rollout settings (the agent writing, or
    ``turn_fn``), collated. ``temperature`` defaults to ``cfg.rollout.temperature``."""
    eps = rollout(
        agent.policy if turn_fn is None else None,
        agent.tokenizer,
        _envs(cfg, len(seeds)),
        seeds,
        groups=groups,
        max_turns=cfg.env.max_turns,
        max_turn_tokens=cfg.rollout.max_turn_tokens,
        max_tokens=cfg.rollout.max_tokens,
        instructions=cfg.rollout.instructions,
        temperature=cfg.rollout.temperature if temperature is None else temperature,
        top_p=cfg.rollout.top_p,
        generator=generator,
        turn_fn=turn_fn,
        count_solver_moves=count_solver_moves,
        measure_perception=measure_perception,
    )
    return collate(eps, agent.tokenizer.pad_token_id)


def episode_stats(traj: Trajectories, prefix: str) -> dict[str, float]:
    turns = traj.turns.float()
    agent_tokens = traj.mask.sum(1).float()
    action = (traj.roles == int(Role.ACTION)) & traj.mask
    counted = [e.solver_moves for e in traj.episodes]
    extra = (
        {f"{prefix}/solver_agreement": sum(counted) / max(float(turns.sum()), 1.0)}
        if counted and min(counted) >= 0
        else {}
    )
    state_turns = sum(e.state_turns for e in traj.episodes)
    if state_turns:  # perception: the state the scratchpads state, against the truth
        extra[f"{prefix}/state_exact"] = sum(e.state_exact for e in traj.episodes) / state_turns
        extra[f"{prefix}/state_tokens"] = sum(e.state_tokens for e in traj.episodes) / state_turns
    return {
        f"{prefix}/return": float(traj.episode_return.mean()),
        f"{prefix}/success": float(traj.success.float().mean()),
        f"{prefix}/invalid_rate": float(traj.invalid_turns.sum() / turns.sum().clamp(min=1)),
        f"{prefix}/turns": float(turns.mean()),
        f"{prefix}/tokens": float((traj.last_index + 1).float().mean()),
        f"{prefix}/agent_tokens": float(agent_tokens.mean()),
        f"{prefix}/agent_tokens_std": float(agent_tokens.std(unbiased=False)),
        f"{prefix}/action_token_share": float(action.sum() / traj.mask.sum().clamp(min=1)),
        **extra,
    }


def eval_settings(
    cfg: LMRunConfig,
    episodes: int | None = None,
    temperature: float | None = None,
    seed_offset: int | None = None,
    maps: int | None = None,
) -> dict[str, Any]:
    """The episodes, temperature, first held-out seed and number of distinct maps (0: one
    per episode) an evaluation uses: the arguments, or the config's ``eval`` section where
    they are None."""
    return {
        "episodes": episodes or cfg.eval.episodes,
        "temperature": cfg.eval.temperature if temperature is None else temperature,
        "seed_offset": cfg.eval.seed_offset if seed_offset is None else seed_offset,
        "maps": cfg.eval.maps if maps is None else maps,
    }


def eval_seeds(n: int, seed_offset: int, maps: int) -> list[int]:
    """The env seed of each of ``n`` evaluation episodes: ``maps`` held-out maps in turn
    (``offset, offset + 1, …, offset + maps - 1, offset, …``), or ``n`` distinct ones when
    ``maps`` is 0."""
    return [seed_offset + (i % maps if maps else i) for i in range(n)]


@torch.no_grad()
def evaluate(
    agent: torch.nn.Module,
    cfg: LMRunConfig,
    episodes: int | None = None,
    temperature: float | None = None,
    seed_offset: int | None = None,
    par: Parallel = _SINGLE,
    maps: int | None = None,
) -> dict[str, float]:
    """Success rate, invalid-action rate, mean turns and tokens on held-out env seeds.

    With several processes each plays every ``world``-th seed and the stats are averaged.
    """
    settings = eval_settings(cfg, episodes, temperature, seed_offset, maps)
    n, temp = settings["episodes"], settings["temperature"]
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    was_training = agent.training
    agent.eval()
    if n < par.world:
        raise ValueError(f"{n} evaluation episodes cannot be shared by {par.world} processes")
    mine = eval_seeds(n, settings["seed_offset"], settings["maps"])[par.rank :: par.world]
    eps = []
    for start in range(0, len(mine), 64):  # chunks bound the memory of one batched generation
        seeds = mine[start : start + 64]
        eps += run_episodes(
            agent,
            cfg,
            seeds,
            temperature=temp,
            generator=gen,
            count_solver_moves=True,
            measure_perception=True,
        ).episodes
    agent.train(was_training)
    stats = episode_stats(collate(eps, agent.tokenizer.pad_token_id), "eval")
    return par.average_metrics(stats, float(len(eps)))

"""Classic PPO, tokenergy against Stable-Baselines3, same hyper-parameters, network and envs.

Usage: python benchmarks/sb3_ppo.py [--seeds 10] [--envs cartpole bottleneck] [--jobs 2]
Needs the benchmark extra: `pip install -e '.[bench]'` (`make bench` does it).

For each env preset (configs/cartpole.yaml, configs/bottleneck.yaml) and seed, both libraries
train the same PPO: the preset's number of envs, steps per rollout, epochs, minibatches,
learning rate (annealed linearly to 0), gamma, GAE lambda, clip ranges (policy and value),
entropy and value coefficients, gradient clip, Adam eps 1e-5, and separate tanh MLP policy
and value networks of the preset's widths with orthogonal init. Known differences that stay:
SB3 whitens advantages per minibatch, tokenergy over the batch; SB3 steps its envs through a
DummyVecEnv with Monitor wrappers, tokenergy through its own batched env.

Each (library, env, seed) run is a fresh process with one torch thread; the runs of the two
libraries are interleaved over --jobs workers so both see the same machine load. Reported:
environment steps per second (median over seeds, and the ratio tokenergy / SB3), the mean
return of the last 10 finished training episodes at fixed step budgets (mean ± std over
seeds), and each process's peak resident memory.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import append_results

CONFIGS = Path(__file__).parent.parent / "configs"
ENVS = {
    # preset, total steps, budgets at which the return is read
    "cartpole": ("cartpole.yaml", 100_000, (25_000, 50_000, 100_000)),
    "bottleneck": ("bottleneck.yaml", 300_000, (100_000, 200_000, 300_000)),
}


def _config(env: str, seed: int):
    from tokenergy.config import load_config

    preset, steps, _ = ENVS[env]
    return load_config(
        CONFIGS / preset,
        {
            "seed": seed,
            "ppo.total_steps": steps,
            "energy.weighting": "none",  # plain PPO
            "log.progress": False,
            "device": "cpu",
        },
    )


def _window_return(ends: list[tuple[int, float]], budget: int, window: int = 10) -> float:
    """Mean return of the last ``window`` episodes finished by step ``budget``."""
    done = [r for step, r in ends if step <= budget][-window:]
    return float(np.mean(done)) if done else float("nan")


def _run_tokenergy(env: str, seed: int) -> dict:
    from tokenergy.algos.ppo import train_ppo

    cfg = _config(env, seed)
    hist = train_ppo(cfg).history
    wall = hist[-1]["perf/elapsed_s"]  # from the first reset, as SB3's learn(): setup excluded
    # rollout/return is already the mean of the last log.episode_window (10) episodes.
    at = {}
    for b in ENVS[env][2]:
        rows = [r for r in hist if r["train/global_step"] <= b and "rollout/return" in r]
        at[b] = rows[-1]["rollout/return"] if rows else float("nan")
    return {"steps": hist[-1]["train/global_step"], "wall": wall, "at": at}


def _run_sb3(env: str, seed: int) -> dict:
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    import tokenergy.envs  # noqa: F401  (registers tokenergy/BottleneckGrid-v0)

    cfg = _config(env, seed)
    p = cfg.ppo
    n_envs = cfg.env.num_envs
    kwargs = dict(cfg.env.kwargs or {})
    vec = DummyVecEnv([lambda: Monitor(gym.make(cfg.env.id, **kwargs)) for _ in range(n_envs)])
    vec.seed(seed)
    act = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[cfg.model.activation]
    hidden = list(cfg.model.hidden_sizes)
    model = PPO(
        "MlpPolicy",
        vec,
        learning_rate=(lambda f: p.lr * f) if p.anneal_lr else p.lr,
        n_steps=p.num_steps,
        batch_size=n_envs * p.num_steps // p.minibatches,
        n_epochs=p.epochs,
        gamma=p.gamma,
        gae_lambda=p.lam,
        clip_range=p.clip_eps,
        clip_range_vf=p.value_clip,
        normalize_advantage=p.norm_adv,
        ent_coef=p.ent_coef,
        vf_coef=p.vf_coef,
        max_grad_norm=p.max_grad_norm,
        policy_kwargs={"net_arch": {"pi": hidden, "vf": hidden}, "activation_fn": act},
        seed=seed,
        device="cpu",
        verbose=0,
    )
    t0 = time.perf_counter()
    model.learn(total_timesteps=p.total_steps)
    wall = time.perf_counter() - t0
    # Episode ends in global steps: the envs step together, so an episode that ends at an
    # env's k-th step ends at global step k * n_envs.
    ends = []
    for m in vec.envs:  # Monitor wrappers
        local = np.cumsum(m.get_episode_lengths())
        ends += [
            (int(s) * n_envs, float(r)) for s, r in zip(local, m.get_episode_rewards(), strict=True)
        ]
    ends.sort()
    at = {b: _window_return(ends, b) for b in ENVS[env][2]}
    return {"steps": model.num_timesteps, "wall": wall, "at": at}


def one_run(task: tuple[str, str, int]) -> dict:
    import torch

    torch.set_num_threads(1)
    lib, env, seed = task
    out = (_run_tokenergy if lib == "tokenergy" else _run_sb3)(env, seed)
    out.update(lib=lib, env=env, seed=seed, sps=out["steps"] / out["wall"])
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _fmt(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "—"
    return f"{np.mean(xs):.1f} ± {np.std(xs):.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    try:
        import stable_baselines3
    except ImportError:
        sys.exit("stable-baselines3 is not installed: pip install -e '.[bench]' (or make bench)")
    tasks = [(lib, e, s) for e in a.envs for s in range(a.seeds) for lib in ("tokenergy", "sb3")]
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    with ctx.Pool(a.jobs, maxtasksperchild=1) as pool:
        rows = []
        for r in pool.imap_unordered(one_run, tasks):
            rows.append(r)
            print(
                f"{r['lib']:>9} {r['env']:<10} seed {r['seed']}: {r['sps']:,.0f} steps/s, "
                f"{r['wall']:.0f} s, peak {r['peak_mb']:.0f} MB",
                flush=True,
            )
    lines = [
        "| env | library | steps/s (median) | tokenergy / SB3 | "
        + " | ".join(f"return, budget {k + 1}" for k in range(3))
        + " | peak memory (MB, median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in a.envs:
        med = {}
        for lib in ("tokenergy", "sb3"):
            rs = [r for r in rows if r["lib"] == lib and r["env"] == e]
            med[lib] = statistics.median(r["sps"] for r in rs)
        for lib in ("tokenergy", "sb3"):
            rs = [r for r in rows if r["lib"] == lib and r["env"] == e]
            ratio = f"{med['tokenergy'] / med['sb3']:.2f}x" if lib == "tokenergy" else ""
            budgets = " | ".join(
                f"@{b // 1000}k {_fmt([r['at'][b] for r in rs])}" for b in ENVS[e][2]
            )
            lines.append(
                f"| {e} | {'tokenergy' if lib == 'tokenergy' else 'SB3'} | {med[lib]:,.0f} | "
                f"{ratio} | {budgets} | {statistics.median(r['peak_mb'] for r in rs):.0f} |"
            )
    table = "\n".join(lines) + "\n\nFinal return per seed (seeds 0, 1, …):\n"
    for e in a.envs:
        last = ENVS[e][2][-1]
        for lib in ("tokenergy", "sb3"):
            rs = sorted(
                (r for r in rows if r["lib"] == lib and r["env"] == e), key=lambda r: r["seed"]
            )
            table += f"\n- {e}, {lib}: " + ", ".join(f"{r['at'][last]:.2f}" for r in rs)

    summary = (
        f"\n\n{a.seeds} seeds per library and env, one torch thread per run, {a.jobs} runs at a "
        f"time (the libraries interleaved), {time.perf_counter() - t0:.0f} s in all; "
        f"stable-baselines3 {stable_baselines3.__version__}. Return: mean of the last 10 "
        "finished training episodes at the budget, mean ± std over seeds."
    )
    print(table + summary)
    append_results("Classic PPO: tokenergy vs Stable-Baselines3", table + summary)


if __name__ == "__main__":
    main()

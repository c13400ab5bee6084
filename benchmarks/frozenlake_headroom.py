"""How much can RL gain on slippery FrozenLake? Exact success probabilities, no sampling.

For random 4x4 maps (the held-out env seeds of the presets) and each move budget H, dynamic
programming over (cell, moves left) gives the chance of reaching G within H moves for:

- the scripted solver (value iteration, the policy the SFT data demonstrates),
- the same solver with epsilon-noise (each move replaced by a uniform random one with
  probability epsilon: what SFT on the noisy demonstrations imitates),
- the best policy for that H (finite-horizon optimal: the ceiling of any agent),

and, per decision of the epsilon-noisy policy (weighted by how often it reaches each state),
the mean gap Q(s, solver move) - Q(s, uniform random move): what one noisy move costs, the
signal a policy gradient has to find under the episode's Bernoulli noise.

Usage: python benchmarks/frozenlake_headroom.py [--maps 256] [--horizons 12 20 30]
[--epsilon 0.1] [--doc docs/results/frozenlake-headroom.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine
from tokenergy.envs import make

SEED_OFFSET = 1_000_000  # eval.seed_offset: the held-out env seeds


def _transitions(env) -> tuple[np.ndarray, np.ndarray, int]:
    """``T[s, a, s']`` of the slippery rule, ``goal[s]`` (1 at G), and the start cell."""
    n, m = len(env.desc), len(env.desc[0])
    S = n * m
    T = np.zeros((S, 4, S))
    goal = np.zeros(S)
    for r in range(n):
        for c in range(m):
            s = r * m + c
            ch = env.desc[r][c]
            goal[s] = ch == "G"
            if ch in "GH":
                continue  # absorbing: no move leaves it (T row stays zero)
            for a in range(4):
                for b in ((a - 1) % 4, a, (a + 1) % 4):
                    u = env._move((r, c), b)
                    T[s, a, u[0] * m + u[1]] += 1 / 3
    start = env.pos[0] * m + env.pos[1]
    return T, goal, start


def map_stats(seed: int, horizons: list[int], eps: float) -> dict[int, tuple[float, ...]]:
    """Per H: (solver, eps-noisy solver, finite-horizon optimal, mean per-decision gap)."""
    env = make("frozenlake", is_slippery=True, max_steps=max(horizons))
    env.reset(seed=seed)
    T, goal, start = _transitions(env)
    S = T.shape[0]
    m = len(env.desc[0])
    pol = env._solve()
    solver = np.array([pol[(s // m, s % m)] for s in range(S)])
    pi_eps = np.full((S, 4), eps / 4)
    pi_eps[np.arange(S), solver] += 1 - eps
    decides = T.sum((1, 2)) > 0  # not G, not a hole: a move is chosen there
    out = {}
    for H in horizons:
        # v_*[s]: P(reach G within the moves left | at s); entering G counts once (goal[s'])
        v_sol, v_eps, v_opt = np.zeros(S), np.zeros(S), np.zeros(S)
        q_eps = []  # Q of the noisy policy with h + 1 moves left, h = 0 .. H-1
        for _ in range(H):
            q_sol = T @ (goal + v_sol)  # (S, 4)
            q_e = T @ (goal + v_eps)
            q_o = T @ (goal + v_opt)
            v_sol = q_sol[np.arange(S), solver]
            v_eps = (pi_eps * q_e).sum(1)
            v_opt = q_o.max(1)
            q_eps.append(q_e)
        # the noisy policy's state distribution, move by move, and the gap at each decision
        d = np.zeros(S)
        d[start] = 1.0
        gap = mass = 0.0
        for t in range(H):
            q = q_eps[H - 1 - t]
            w = d * decides
            gap += float((w * (q[np.arange(S), solver] - q.mean(1))).sum())
            mass += float(w.sum())
            d = np.einsum("s,sa,sau->u", w, pi_eps, T)
        out[H] = (v_sol[start], v_eps[start], v_opt[start], gap / max(mass, 1e-12))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--maps", type=int, default=256)
    ap.add_argument("--horizons", type=int, nargs="+", default=[12, 20, 30])
    ap.add_argument("--epsilon", type=float, default=0.1)
    ap.add_argument("--doc", default="docs/results/frozenlake-headroom.md")
    a = ap.parse_args()
    rows = [map_stats(SEED_OFFSET + k, a.horizons, a.epsilon) for k in range(a.maps)]
    lines = [
        f"| moves H | scripted solver | solver with ε = {a.epsilon} | best policy for H "
        "| cost of one noisy move (mean Q gap) |",
        "|---|---|---|---|---|",
    ]
    for H in a.horizons:
        x = np.array([r[H] for r in rows])
        lines.append(
            f"| {H} | {x[:, 0].mean():.3f} | {x[:, 1].mean():.3f} | {x[:, 2].mean():.3f} "
            f"| {x[:, 3].mean():.4f} |"
        )
    cmd = " ".join(["python benchmarks/frozenlake_headroom.py", *sys.argv[1:]])
    text = (
        "# Slippery FrozenLake: how much success is there to gain?\n\n"
        f"- command: `{cmd}`\n"
        f"- machine: {machine()}\n"
        f"- {a.maps} random 4x4 maps (env seeds {SEED_OFFSET} and up, the presets' held-out "
        "seeds); exact probabilities by dynamic programming, nothing sampled\n\n"
        + "\n".join(lines)
        + "\n\nThe scripted solver is the policy the SFT data demonstrates (value iteration, "
        "discount 0.99); the best policy for H maximises the chance of reaching G within H "
        "moves. The last column is what one uniformly random move costs the noisy policy in "
        "success probability, averaged over the decisions it makes.\n"
    )
    doc = Path(a.doc)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    print("\n".join(lines))
    print(f"wrote {doc}")


if __name__ == "__main__":
    main()

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

With ``--per-turn 2`` (the paper's form: two moves a turn, the second chosen before the first's
slip is seen, H / 2 turns) three more columns: the solver's two-move plan, the best policy over
move pairs, and uniformly random moves. ``--layout random`` draws the paper's maps (start and
goal on random cells) instead of Gymnasium's corners.

Usage: python benchmarks/frozenlake_headroom.py [--maps 256] [--horizons 12 20 30]
[--epsilon 0.1] [--per-turn 1] [--layout corners] [--doc docs/results/frozenlake-headroom.md]
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


def pair_stats(T: np.ndarray, goal: np.ndarray, start: int, solver: np.ndarray, env, turns: int):
    """(solver's two-move plan, best pair policy, random moves): P(reach G within ``turns``
    turns of two moves, the second chosen before the first's slip is seen)."""
    S = T.shape[0]
    m = len(env.desc[0])
    planned = np.array([env._move((s // m, s % m), int(solver[s])) for s in range(S)])
    second = solver[planned[:, 0] * m + planned[:, 1]]  # the plan's move from where it meant to be

    def q(v: np.ndarray) -> np.ndarray:
        # q[s, a1, a2]: a1 from s, then a2 from wherever a1 slid (nothing after G or a hole)
        return np.einsum("sau,ubw,w->sab", T, T, goal + v) + (T @ goal)[:, :, None]

    v_sol, v_opt, v_rnd = np.zeros(S), np.zeros(S), np.zeros(S)
    for _ in range(turns):
        v_sol = q(v_sol)[np.arange(S), solver, second]
        v_opt = q(v_opt).reshape(S, 16).max(1)
        v_rnd = q(v_rnd).reshape(S, 16).mean(1)
    return v_sol[start], v_opt[start], v_rnd[start]


def map_stats(
    seed: int, horizons: list[int], eps: float, per_turn: int = 1, layout: str = "corners"
) -> dict[int, tuple[float, ...]]:
    """Per H: (solver, eps-noisy solver, finite-horizon optimal, mean per-decision gap), and
    with ``per_turn=2`` the three of :func:`pair_stats`."""
    env = make("frozenlake", is_slippery=True, max_steps=max(horizons), layout=layout)
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
        if per_turn == 2:
            out[H] += pair_stats(T, goal, start, solver, env, H // 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--maps", type=int, default=256)
    ap.add_argument("--horizons", type=int, nargs="+", default=[12, 20, 30])
    ap.add_argument("--epsilon", type=float, default=0.1)
    ap.add_argument("--per-turn", type=int, choices=(1, 2), default=1)
    ap.add_argument("--layout", choices=("corners", "random"), default="corners")
    ap.add_argument("--doc", default="docs/results/frozenlake-headroom.md")
    a = ap.parse_args()
    rows = [
        map_stats(SEED_OFFSET + k, a.horizons, a.epsilon, a.per_turn, a.layout)
        for k in range(a.maps)
    ]
    head = (
        f"| moves H | scripted solver | solver with ε = {a.epsilon} | best policy for H "
        "| cost of one noisy move (mean Q gap) |"
    )
    if a.per_turn == 2:
        head += " solver, 2 moves a turn | best, 2 moves a turn | random moves |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for H in a.horizons:
        x = np.array([r[H] for r in rows])
        cells = [f"{x[:, k].mean():.3f}" for k in range(3)] + [f"{x[:, 3].mean():.4f}"]
        cells += [f"{x[:, k].mean():.3f}" for k in range(4, x.shape[1])]
        lines.append(f"| {H} | " + " | ".join(cells) + " |")
    cmd = " ".join(["python benchmarks/frozenlake_headroom.py", *sys.argv[1:]])
    text = (
        "# Slippery FrozenLake: how much success is there to gain?\n\n"
        f"- command: `{cmd}`\n"
        f"- machine: {machine()}\n"
        f"- {a.maps} random 4x4 maps (env seeds {SEED_OFFSET} and up, the presets' held-out "
        f"seeds; start and goal: {a.layout}); exact probabilities by dynamic programming, "
        "nothing sampled\n\n"
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

"""Where the time of one PPO iteration of the paper's size goes, by kind of operation, and how
fast the attention kernels run on the model's shapes (and on wider heads of the same width).

Usage: python benchmarks/iteration_profile.py [--env sokoban] [--size tiny] [--algo ppo]
[--episodes 128] [--iterations 3] [--threads 2] [--sft-episodes 512]

The preset's iteration (``configs/<env>-<algo>.yaml``, up to 5 turns, the SFT agent of
``benchmarks/rl_iteration.py``) runs ``--iterations`` times under ``torch.profiler``; the
operators' own time is summed into attention (the fused attention kernels, forward and
backward), matrix products (``mm``, ``addmm``, ``bmm``), and everything else; what the
profiler saw of no operator is Python and the framework around the kernels. Beside it, the
attention of one update chunk (8 rows of the iteration's mean length, the model's heads and head
size, causal), forward and backward, with each of PyTorch's CPU backends, as FLOP/s against the
fp32 matmul rate measured in the same run: the rate the update's largest cost can reach here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import append_results
from rl_iteration import iteration_config, matmul_rate, sft_agent

ATTENTION = ("scaled_dot_product", "flash_attention")
MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def op_groups(events) -> dict[str, float]:
    """Seconds of operator self time in each group (attention, matmul, other)."""
    groups = {"attention": 0.0, "matmul": 0.0, "other": 0.0}
    for e in events:
        sec = e.self_cpu_time_total / 1e6
        if any(k in e.key for k in ATTENTION):
            groups["attention"] += sec
        elif e.key in MATMUL:
            groups["matmul"] += sec
        else:
            groups["other"] += sec
    return groups


def attention_rates(rows: int, heads: int, length: int, head_dim: int) -> dict[str, float]:
    """FLOP/s of causal attention forward + backward on ``(rows, heads, length, head_dim)`` with
    each CPU backend (median of 5 after a warm-up): 4·L²·d per head forward, halved by the
    causal mask, and 2.5× that for the backward."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    flops = 3.5 * 0.5 * 4 * rows * heads * length * length * head_dim
    rates = {}
    for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("math", SDPBackend.MATH)]:
        q, k, v = (torch.randn(rows, heads, length, head_dim, requires_grad=True) for _ in "qkv")
        times = []
        for _ in range(6):
            t0 = time.perf_counter()
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            times.append(time.perf_counter() - t0)
        rates[name] = flops / statistics.median(times[1:])
    return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="sokoban")
    p.add_argument("--size", default="tiny")
    p.add_argument("--algo", default="ppo")
    p.add_argument("--episodes", type=int, default=128)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sft-episodes", type=int, default=512)
    a = p.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from tokenergy.algos.lm import train_lm
    from tokenergy.models.lm import MODEL_SIZES

    torch.set_num_threads(a.threads)
    agent = sft_agent(a.env, a.size, a.sft_episodes, a.threads, "cpu")
    cfg = iteration_config(a.env, a.algo, agent, a.episodes, a.iterations, "cpu")

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        history = train_lm(cfg).history
    iterations = [r for r in history if "perf/rollout_s" in r]
    wall = sum(r["perf/rollout_s"] + r["perf/update_s"] for r in iterations)
    groups = op_groups(prof.key_averages())  # set-up's operators are few next to the iterations'
    groups["Python and framework (no operator)"] = max(0.0, wall - sum(groups.values()))
    steps = iterations[1:]
    per_iter = {k: v / len(iterations) for k, v in groups.items()}
    total = sum(per_iter.values())

    hidden, _layers, heads, _inter = MODEL_SIZES[a.size]
    length = round(statistics.mean(r["rollout/tokens"] for r in steps))
    rates = attention_rates(8, heads, length, hidden // heads)
    # the same width in fewer, wider heads: what another model shape would buy
    wider = {
        d: attention_rates(8, hidden // d, length, d)["flash"] for d in (32, 64) if d <= hidden
    }
    mm = matmul_rate(a.threads, "cpu")

    lines = ["| kind of work | s per iteration | share |", "|---|---|---|"]
    for k, v in per_iter.items():
        lines.append(f"| {k} | {v:.2f} | {v / total:.0%} |")
    lines += [
        "",
        f"Split by stage (medians of the iterations after the first, profiled): rollout "
        f"{statistics.median(r['perf/rollout_s'] for r in steps):.2f} s, scoring "
        f"{statistics.median(r['perf/score_s'] for r in steps):.2f} s, update "
        f"{statistics.median(r['perf/update_s'] - r['perf/score_s'] for r in steps):.2f} s.",
        "",
        f"Causal attention of one update chunk (8 rows × {heads} heads × {length} tokens × "
        f"head size {hidden // heads}), forward + backward: flash "
        f"{rates['flash'] / 1e9:.1f} GFLOP/s, math {rates['math'] / 1e9:.1f} GFLOP/s; fp32 "
        f"matmul (512³) {mm / 1e9:.0f} GFLOP/s. The same width in fewer, wider heads (flash): "
        + ", ".join(f"head size {d}: {r / 1e9:.1f} GFLOP/s" for d, r in wider.items())
        + ".",
        "",
        f"{a.env}, `{a.size}`, configs/{a.env}-{a.algo}.yaml, {a.episodes} trajectories of up "
        f"to 5 turns (mean {length} tokens), {a.iterations} iterations under torch.profiler "
        f"(its own cost included); {a.threads} torch threads.",
    ]
    body = "\n".join(lines)
    print(body)
    append_results(f"Where a {a.algo.upper()} iteration's time goes ({a.env}, {a.size}, cpu)", body)


if __name__ == "__main__":
    main()

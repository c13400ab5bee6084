"""Rollout and update throughput of the LM agents, for each model size, on this machine.

Usage: python benchmarks/lm_throughput.py [--env sokoban] [--episodes 16] [--repeats 3]
[--device cpu] [--threads 2] [--sizes tiny small base]

Rollout: batched multi-turn generation of ``--episodes`` episodes (sampled, temperature 1, the
scripted env); agent tokens generated per second. Update: forward + backward of the same
batch (all tokens, observations included) per second. Median over ``--repeats``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import append_results


def main() -> None:
    import torch

    from tokenergy.envs import make
    from tokenergy.models import MODEL_SIZES, build_agent
    from tokenergy.rollout import collate, rollout, token_logprobs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="sokoban")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", nargs="+", default=list(MODEL_SIZES), choices=list(MODEL_SIZES))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    rows = []
    for size in a.sizes:
        agent = build_agent(size, seed=0).to(device)
        params = sum(p.numel() for p in agent.parameters())
        opt = torch.optim.AdamW(agent.parameters(), lr=1e-5)
        gen_rates, upd_rates, lengths = [], [], []
        for r in range(a.repeats):
            envs = [make(a.env) for _ in range(a.episodes)]
            t0 = time.perf_counter()
            eps = rollout(
                agent.policy,
                agent.tokenizer,
                envs,
                list(range(r * 100, r * 100 + a.episodes)),
                max_turns=6,
                max_turn_tokens=40,
                generator=torch.Generator().manual_seed(r),
            )
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_gen = time.perf_counter() - t0
            traj = collate(eps, agent.tokenizer.pad_token_id)
            gen_rates.append(int(traj.mask.sum()) / t_gen)
            lengths.append(traj.tokens.shape[1])
            tokens = traj.tokens.to(device)
            attn = traj.attention_mask.to(device)
            t1 = time.perf_counter()
            out = agent(tokens, attn)
            loss = -(token_logprobs(out.logits, tokens) * traj.mask.to(device)).sum()
            loss = loss + out.values.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            upd_rates.append(int(traj.attention_mask.sum()) / (time.perf_counter() - t1))
        rows.append(
            (
                size,
                params,
                statistics.median(lengths),
                statistics.median(gen_rates),
                statistics.median(upd_rates),
            )
        )
        print(f"{size}: {rows[-1][3]:,.0f} gen tok/s, {rows[-1][4]:,.0f} update tok/s", flush=True)
    table = [
        "| model | parameters | batch x length | rollout: agent tokens/s | update: tokens/s |",
        "|---|---|---|---|---|",
    ]
    for size, params, length, gen, upd in rows:
        table.append(
            f"| {size} | {params:,} | {a.episodes} x {length:.0f} | {gen:,.0f} | {upd:,.0f} |"
        )
    body = "\n".join(table) + (
        f"\n\nenv {a.env}, {a.episodes} episodes of up to 6 turns, {a.threads} torch threads, "
        f"device {a.device}, median of {a.repeats}. A random policy writes up to 40 tokens a turn."
    )
    print(body)
    append_results(f"LM agent throughput by model size ({a.env}, {a.device})", body)


if __name__ == "__main__":
    main()

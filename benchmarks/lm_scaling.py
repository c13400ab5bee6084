"""How an LM update scales with sequence length, batch size and model size, against a roofline.

Usage: python benchmarks/lm_scaling.py [--device cpu] [--threads 2] [--repeats 3]
[--sizes tiny small base] [--lengths 128 256 512] [--batches 8 16 32]

One training step of the policy (forward, token-mean log-likelihood loss, backward, AdamW
step) on random tokens, timed per (model size, batch, length): a sweep of the length at batch
16, and of the batch at length 256. The step's floating-point work is counted as
3 × forward, forward = 2 · N · tokens + 2 · layers · B · T² · d (N: the weights used per token,
input embedding excluded; the second term: attention scores and their weighted sum, causal
halves not subtracted, as in Kaplan et al., 2020). The roofline is this device's measured
float32 matmul throughput (a 2048² · 2048² product on the same threads): achieved FLOP/s over
it says how much of the machine the step uses.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import append_results


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_flops(device, n: int = 2048, repeats: int = 10) -> float:
    """Measured float32 matmul FLOP/s (best of ``repeats``)."""
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    a @ b
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def step_time(agent, batch: int, length: int, repeats: int, device) -> float:
    """Median seconds of one training step of the policy on ``batch × length`` random tokens."""
    import torch

    from tokenergy.rollout import token_logprobs

    policy = agent.policy
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    vocab = policy.config.vocab_size
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, vocab, (batch, length), generator=g).to(device)
    mask = torch.ones(batch, length, dtype=torch.bool, device=device)
    times = []
    for r in range(repeats + 1):  # the first is a warm-up
        _sync(device)
        t0 = time.perf_counter()
        logits = policy(input_ids=tokens, attention_mask=mask.long()).logits
        loss = -(token_logprobs(logits, tokens) * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _sync(device)
        if r:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def train_flops(agent, batch: int, length: int) -> float:
    cfg = agent.policy.config
    emb = agent.policy.get_input_embeddings().weight.numel()
    n = sum(p.numel() for p in agent.policy.parameters()) - emb
    if cfg.tie_word_embeddings:  # the tied output layer is still a matmul per token
        n += emb
    d, layers = cfg.hidden_size, cfg.num_hidden_layers
    forward = 2 * n * batch * length + 2 * layers * batch * length * length * d
    return 3 * forward


def main() -> None:
    import torch

    from tokenergy.models import build_agent

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small", "base"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[128, 256, 512])
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 16, 32])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    peak = matmul_flops(device)
    print(f"matmul roofline: {peak / 1e9:.1f} GFLOP/s", flush=True)
    points = sorted(
        {(16, t) for t in a.lengths} | {(b, 256) for b in a.batches}, key=lambda x: (x[1], x[0])
    )
    lines = [
        "| model | parameters | batch × length | s / step | tokens / s | GFLOP/s | of roofline |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in a.sizes:
        agent = build_agent(size, seed=0, max_positions=max(a.lengths)).to(device)
        params = sum(p.numel() for p in agent.policy.parameters())
        for batch, length in points:
            s = step_time(agent, batch, length, a.repeats, device)
            flops = train_flops(agent, batch, length) / s
            line = (
                f"| {size} | {params:,} | {batch} × {length} | {s:.3f} | "
                f"{batch * length / s:,.0f} | {flops / 1e9:.2f} | {flops / peak:.1%} |"
            )
            lines.append(line)
            print(line, flush=True)
    table = "\n".join(lines)
    body = (
        f"{table}\n\nRoofline: float32 2048² matmul, {peak / 1e9:.1f} GFLOP/s on {a.threads} "
        f"threads, device {a.device}. A step: forward, loss, backward, AdamW; median of "
        f"{a.repeats} after a warm-up."
    )
    append_results(f"LM update scaling and roofline ({a.device})", body)


if __name__ == "__main__":
    main()

"""One turn of generation with the decode engine against the Hugging Face forward with its cache.

Usage: python benchmarks/fast_decode.py [--batch 32] [--prompt 200] [--tokens 48] [--repeats 5]
[--threads 2] [--device cpu]

For each model size: ``generate_turns`` on the same left-padded prompts (lengths around
``--prompt``), ``--tokens`` new tokens, no stop token, sampled with the same generator, with
``TOKENERGY_FAST_DECODE`` on and off; median seconds over ``--repeats`` after a warm-up. Both
paths must write the same tokens (checked).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import append_results


def main() -> None:
    import torch

    from tokenergy.models import MODEL_SIZES, build_agent
    from tokenergy.rollout import generate_turns

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lines = [
        "| model | HF forward + cache (s) | decode engine (s) | speed-up |",
        "|---|---|---|---|",
    ]
    for size in MODEL_SIZES:
        agent = build_agent(size, seed=0).to(a.device).eval()
        tok = agent.tokenizer
        g = torch.Generator().manual_seed(0)
        vocab = len(tok)
        contexts = [
            [
                tok.bos_token_id,
                *torch.randint(8, vocab, (a.prompt - 7 + i % 8,), generator=g).tolist(),
            ]
            for i in range(a.batch)
        ]
        times, outs = {}, {}
        for mode in ("0", "1"):
            os.environ["TOKENERGY_FAST_DECODE"] = mode
            runs = []
            for r in range(a.repeats + 1):
                t0 = time.perf_counter()
                outs[mode] = generate_turns(
                    agent.policy, contexts, set(), tok.pad_token_id, a.tokens, 1.0, 1.0,
                    torch.Generator().manual_seed(r),
                )  # fmt: skip
                if r:
                    runs.append(time.perf_counter() - t0)
            times[mode] = statistics.median(runs)
        if outs["0"] != outs["1"]:
            sys.exit(f"{size}: the two decode paths wrote different tokens")
        line = f"| {size} | {times['0']:.3f} | {times['1']:.3f} | {times['0'] / times['1']:.2f}x |"
        lines.append(line)
        print(line, flush=True)
    os.environ.pop("TOKENERGY_FAST_DECODE", None)
    body = "\n".join(lines) + (
        f"\n\nbatch {a.batch}, prompts of ~{a.prompt} tokens (left-padded), {a.tokens} new tokens, "
        f"sampled; median of {a.repeats}; {a.threads} torch threads, device {a.device}; both "
        "paths wrote the same tokens."
    )
    append_results(f"Turn generation: decode engine vs Hugging Face ({a.device})", body)


if __name__ == "__main__":
    main()

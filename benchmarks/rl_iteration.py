"""One RL iteration of the ActFocus paper's size, split into rollout / scoring / update, beside
the physical limit and Hugging Face ``generate()``; optionally against another checkout.

Usage: python benchmarks/rl_iteration.py [--envs sokoban frozenlake] [--sizes tiny small]
[--algos ppo grpo] [--episodes 128] [--iterations 3] [--threads 2] [--device cpu]
[--baseline WORKTREE] [--processes 2] [--sft-episodes 512]

For each env × size: an agent is SFT-trained once on ``--sft-episodes`` solver episodes of the
env's preset (``configs/<env>-ppo.yaml``, epsilon 0.5; cached under ``runs/bench/``) so that
its turns have a trained agent's lengths. Then, for each algorithm, the preset's RL iteration
(``configs/<env>-<algo>.yaml``: its critic, KL reference, epochs and minibatches) runs on
``--episodes`` trajectories of up to 5 turns, ``--iterations`` times from that agent; the
median over all but the first (warm-up) is reported as rollout, scoring (the no-gradient
forward passes) and update seconds, and generated agent tokens per second of rollout.

Beside it, in the same run:
- the limit: model FLOPs per token (2 × parameters, plus attention over the mean context)
  divided by the fp32 matmul rate measured here, for generation (forward) and for the update
  (forward + backward, 3×);
- Hugging Face ``generate()`` with its static cache on a plain Llama of the same size, on the
  first turn's prompts, every row writing the same number of tokens, against our engine on the
  same prompts (``--hf-compare``);
- ``--baseline WORKTREE``: the same iterations with the ``tokenergy`` of another checkout (a
  ``git worktree`` at the commit to compare with), run in a subprocess from the same agent;
- ``--processes N``: the same iterations as N data-parallel processes (``torchrun``, gloo) of
  ``threads / N`` torch threads each, against one process of ``threads`` threads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import ROOT, append_results, run_for_result, run_in_checkout

BENCH = ROOT / "runs" / "bench"


def _preset(env: str, algo: str) -> dict:
    import yaml

    return yaml.safe_load((ROOT / "configs" / f"{env}-{algo}.yaml").read_text())


def sft_agent(env: str, size: str, episodes: int, threads: int, device: str) -> Path:
    """The SFT agent of ``env`` × ``size`` (trained once, then read from ``runs/bench``)."""
    import torch

    from tokenergy.algos.lm import train_lm
    from tokenergy.config import config_from_dict
    from tokenergy.models.lm import save_agent

    folder = BENCH / f"{env}-{size}-sft{episodes}"
    if (folder / "value_head.safetensors").is_file():
        return folder
    torch.set_num_threads(threads)
    raw = _preset(env, "ppo")
    raw["model"]["size"] = size
    raw["model"]["critic"] = "shared"
    raw["sft"].update({"episodes": episodes, "epsilon": 0.5, "epochs": 4})
    raw["algo"]["iterations"] = 0
    raw["eval"] = {"episodes": 1, "every": 1000}
    raw["log"] = {"tensorboard": False, "progress": False}
    raw["device"] = device
    print(f"SFT agent {env} {size} on {episodes} episodes …", flush=True)
    t0 = time.perf_counter()
    agent = train_lm(config_from_dict(raw)).agent
    save_agent(agent, folder)
    print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
    return folder


def iteration_config(env: str, algo: str, agent: Path, episodes: int, iterations: int, device: str):
    """The preset's RL iterations from ``agent``: ``episodes`` trajectories of up to 5 turns,
    ``iterations`` times, the policy updated from the first (no critic warm-up), no evaluation
    after the start's."""
    from tokenergy.config import config_from_dict

    raw = _preset(env, algo)
    raw["model"] = {**raw["model"], "path": str(agent)}
    raw["env"]["max_turns"] = 5
    raw["sft"] = {"episodes": 0}
    raw["rollout"]["episodes"] = episodes
    raw["algo"]["iterations"] = iterations
    raw["algo"]["critic_warmup_iters"] = 0  # time the policy update too
    raw["eval"] = {"episodes": 8, "every": 10_000}  # 8: splits over processes
    raw["log"] = {"tensorboard": False, "progress": False}
    raw["device"] = device
    return config_from_dict(raw)


def iteration_times(env: str, algo: str, agent: Path, a: argparse.Namespace) -> dict:
    """Median seconds of the preset's iteration from ``agent`` with the ``tokenergy`` imported
    here (this checkout, or the baseline's in a child process)."""
    import torch

    from tokenergy.algos.lm import train_lm

    torch.set_num_threads(a.threads)
    cfg = iteration_config(env, algo, agent, a.episodes, a.iterations, a.device)
    history = train_lm(cfg).history[1:]  # the first one warms up

    def med(key: str) -> float:
        vals = [r[key] for r in history if key in r]
        return statistics.median(vals) if vals else float("nan")

    score = med("perf/score_s")
    return {
        "rollout": med("perf/rollout_s"),
        "score": score,
        "update": med("perf/update_s") - (0.0 if score != score else score),
        "gen_tok_s": med("perf/gen_tokens_per_s"),
        "agent_tokens": med("rollout/tokens") * a.episodes,
    }


def matmul_rate(threads: int, device: str) -> float:
    """fp32 matmul FLOP/s on this machine (the best of a few 512³ products)."""
    import torch

    torch.set_num_threads(threads)
    x = torch.randn(512, 512, device=device)
    best = 0.0
    for _ in range(20):
        t0 = time.perf_counter()
        x @ x
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = max(best, 2 * 512**3 / (time.perf_counter() - t0))
    return best


def flops_per_token(size: str, context: float) -> float:
    """Forward FLOPs of one token: 2 × the non-embedding parameters and the LM head, plus
    attention scores and mixing over ``context`` earlier tokens."""
    from tokenergy.models.lm import MODEL_SIZES
    from tokenergy.models.tokenizer import build_tokenizer

    hidden, layers, _, inter = MODEL_SIZES[size]
    vocab = len(build_tokenizer())
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    return 2 * (layers * per_layer + vocab * hidden) + layers * 4 * hidden * context


def hf_compare(env: str, size: str, a: argparse.Namespace) -> tuple[float, float]:
    """Agent tokens/s of ``generate()`` (static cache) and of our engine on the same prompts:
    a plain Llama of ``size``, ``--episodes`` first-turn prompts, 48 tokens each."""
    import torch

    from tokenergy.envs import make
    from tokenergy.models import build_agent
    from tokenergy.rollout import generate_turns, prompt_ids

    torch.set_num_threads(a.threads)
    agent = build_agent(size, seed=0).eval().to(a.device)
    tok, policy = agent.tokenizer, agent.policy
    kwargs = _preset(env, "ppo")["env"].get("kwargs", {})
    prompts = []
    for s in range(a.episodes):
        e = make(env, **kwargs)
        obs, _ = e.reset(seed=s)
        prompts.append(prompt_ids(tok, e, obs, False))
    new = 48
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), tok.pad_token_id)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, L - len(p) :] = torch.tensor(p)
        attn[i, L - len(p) :] = 1
    ids, attn = ids.to(a.device), attn.to(a.device)

    def hf() -> None:
        policy.generate(input_ids=ids, attention_mask=attn, max_new_tokens=new,
                        min_new_tokens=new, do_sample=True, cache_implementation="static",
                        pad_token_id=tok.pad_token_id)  # fmt: skip

    def ours() -> None:
        generate_turns(policy, prompts, set(), tok.pad_token_id, new, 1.0, 1.0,
                       torch.Generator().manual_seed(0))  # fmt: skip

    rates = []
    for fn in (hf, ours):
        fn()  # warm-up
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        rates.append(len(prompts) * new / statistics.median(times))
    return rates[0], rates[1]


def child(a: argparse.Namespace) -> None:
    """In a baseline checkout's interpreter path, or as one of ``--processes`` data-parallel
    processes: print the iteration times as JSON (rank 0 only)."""
    import os

    times = iteration_times(a.env_one, a.algo_one, Path(a.agent_one), a)
    if os.environ.get("RANK", "0") == "0":
        print("RESULT " + json.dumps(times))


def _child_args(env: str, algo: str, agent: Path, a: argparse.Namespace, threads: int) -> list:
    return [
        "--child", "--env-one", env, "--algo-one", algo, "--agent-one", str(agent),
        "--episodes", str(a.episodes), "--iterations", str(a.iterations),
        "--threads", str(threads), "--device", a.device,
    ]  # fmt: skip


def data_parallel_times(env: str, algo: str, agent: Path, a: argparse.Namespace) -> dict:
    """The same iterations as ``--processes`` data-parallel processes (``torchrun``, gloo on
    CPU) of ``threads / processes`` torch threads each, with this checkout's ``tokenergy``."""
    import os

    threads = max(1, a.threads // a.processes)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={a.processes}", __file__, *_child_args(env, algo, agent, a, threads),
    ]  # fmt: skip
    env_vars = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return run_for_result(cmd, env_vars, "the data-parallel run")


def baseline_times(env: str, algo: str, agent: Path, a: argparse.Namespace) -> dict:
    return run_in_checkout([__file__, *_child_args(env, algo, agent, a, a.threads)], a.baseline)


def _total(t: dict) -> float:
    return t["rollout"] + t["score"] + t["update"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", nargs="+", default=["sokoban", "frozenlake"])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--algos", nargs="+", default=["ppo", "grpo"])
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sft-episodes", type=int, default=512)
    ap.add_argument("--baseline", default=None, help="a worktree of the commit to compare with")
    ap.add_argument(
        "--processes", type=int, default=1,
        help="also time the iteration as this many data-parallel processes (torchrun)",
    )  # fmt: skip
    ap.add_argument("--no-hf-compare", dest="hf_compare", action="store_false")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--env-one", help=argparse.SUPPRESS)
    ap.add_argument("--algo-one", help=argparse.SUPPRESS)
    ap.add_argument("--agent-one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    rate = matmul_rate(a.threads, a.device)
    rows = []
    hf_rows = []
    dp_rows = []
    for env in a.envs:
        for size in a.sizes:
            agent = sft_agent(env, size, a.sft_episodes, a.threads, a.device)
            for algo in a.algos:
                print(f"{env} {size} {algo} …", flush=True)
                t = iteration_times(env, algo, agent, a)
                base = baseline_times(env, algo, agent, a) if a.baseline else None
                if a.processes > 1:
                    dp = data_parallel_times(env, algo, agent, a)
                    dp_rows.append((env, size, algo, t, dp))
                    print(f"  {a.processes} processes {json.dumps(dp)}")
                context = 300.0  # about the mean context of a 5-turn episode's tokens
                gen_limit = rate / flops_per_token(size, context)
                upd_limit = rate / (3 * flops_per_token(size, context))
                rows.append((env, size, algo, t, base, gen_limit, upd_limit))
                print(f"  {json.dumps(t)}" + (f"\n  baseline {json.dumps(base)}" if base else ""))
            if a.hf_compare:
                hf_rows.append((env, size, *hf_compare(env, size, a)))
    lines = [
        "| env | model | algo | rollout s | scoring s | update s | iteration s | agent tok/s "
        "| gen. limit tok/s | update limit tok/s |"
        + (" baseline iteration s | baseline rollout s | speed-up |" if a.baseline else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if a.baseline else ""),
    ]
    for env, size, algo, t, base, gl, ul in rows:
        total = _total(t)
        line = (
            f"| {env} | {size} | {algo} | {t['rollout']:.2f} | {t['score']:.2f} | "
            f"{t['update']:.2f} | {total:.2f} | {t['gen_tok_s']:,.0f} | {gl:,.0f} | {ul:,.0f} |"
        )
        if base:
            btotal = (
                base["rollout"]
                + base["update"]
                + (0 if base["score"] != base["score"] else base["score"])
            )
            line += f" {btotal:.2f} | {base['rollout']:.2f} | {btotal / total:.1f}× |"
        lines.append(line)
    body = "\n".join(lines)
    if hf_rows:
        body += (
            "\n\n| env | model | HF generate() static cache tok/s | ours tok/s | ratio |\n"
            "|---|---|---|---|---|\n"
            + "\n".join(
                f"| {e} | {s} | {h:,.0f} | {o:,.0f} | {o / h:.1f}× |" for e, s, h, o in hf_rows
            )
        )
    if dp_rows:
        per = max(1, a.threads // a.processes)
        body += (
            f"\n\n| env | model | algo | 1 process × {a.threads} threads: iteration s "
            f"| {a.processes} processes × {per} thread{'s' if per > 1 else ''}: rollout s "
            "| scoring s | update s | iteration s | speed-up |\n|---|---|---|---|---|---|---|---|---|\n"
            + "\n".join(
                f"| {e} | {s} | {al} | {_total(t):.2f} | {d['rollout']:.2f} | {d['score']:.2f} "
                f"| {d['update']:.2f} | {_total(d):.2f} | {_total(t) / _total(d):.2f}× |"
                for e, s, al, t, d in dp_rows
            )
        )
    body += (
        f"\n\n{a.episodes} trajectories of up to 5 turns per iteration, the presets' PPO / GRPO "
        f"(configs/<env>-<algo>.yaml) from an SFT agent ({a.sft_episodes} episodes); medians of "
        f"{a.iterations - 1} iterations after a warm-up; fp32 matmul {rate / 1e9:.0f} GFLOP/s "
        f"measured in the run; {a.threads} torch threads, device {a.device}"
        + (f"; baseline: the checkout at {a.baseline}" if a.baseline else "")
        + ".\n\n`python benchmarks/rl_iteration.py "
        + " ".join(sys.argv[1:])
        + "`"
    )
    print(body)
    append_results(f"One RL iteration of the paper's size ({a.device})", body)


if __name__ == "__main__":
    main()

"""GRPO on a language model, tokenergy against TRL's GRPOTrainer: same model, task and batch.

Usage: python benchmarks/trl_grpo.py [--steps 30] [--repeats 3] [--model tiny] [--threads 2]
Needs the benchmark extra: `pip install -e '.[bench]'` (`make bench` does it).

The task is one Sudoku move (env `sudoku4` with one turn): the prompt is the puzzle, the
completion ``<think> … </think> <answer> r c v </answer>`` is scored by the env (a correct
fill, a wrong one, or an unparseable answer). One SFT agent (tokenergy's SFT on solver
turns) is the start of both trainers. Settings held equal: 32 completions per step in
groups of 8 (4 puzzles), completions of at most 48 tokens that end at ``</answer>``,
temperature 1, one optimizer step per generated batch (AdamW, constant lr --lr (1e-4), no weight
decay, gradient clip 1; lr --lr), the clipped ratio loss with epsilon 0.2 averaged over the batch's
completion tokens, group-normalised rewards as advantages, no KL term (beta 0).

Each trainer runs ``--repeats`` times from the same start, alternating with the other.
Reported, per trainer: seconds per step (generation, scoring and update; median over the
steps after each run's first two), completion tokens per step and per second, and the mean
reward of the last 10 steps; tokenergy / TRL as a ratio. The reward curves (first repeat)
are drawn side by side.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import append_results

ROOT = Path(__file__).parent.parent
FIGURE = ROOT / "docs" / "results" / "bench" / "trl_grpo_{device}.png"
BATCH, GROUP, MAX_TOKENS = 32, 8, 48


def _config(model: str, steps: int, seed: int, device: str, lr: float):
    from tokenergy.config import load_config

    return load_config(
        ROOT / "configs" / "sudoku4-grpo.yaml",
        {
            "seed": seed,
            "name": "bench-grpo",
            "model.size": model,
            "env.max_turns": 1,
            "sft.episodes": 512,
            "sft.epochs": 4,
            "rollout.episodes": BATCH,
            "rollout.group_size": GROUP,
            "rollout.max_turn_tokens": MAX_TOKENS,
            "algo.iterations": steps,
            "algo.lr": lr,
            "algo.epochs": 1,
            "algo.minibatches": 1,
            "algo.kl_coef": 0.0,
            "algo.norm_adv": False,  # TRL uses the group-normalised rewards as they are
            "algo.max_grad_norm": 1.0,
            "algo.clip_eps": 0.2,
            "eval.episodes": 8,
            "eval.every": 10_000,
            "log.progress": False,
            "device": device,
        },
    )


def sft_start(cfg, folder: Path):
    """The shared start: tokenergy's SFT, saved as a plain Hugging Face model folder."""
    import torch

    from tokenergy.algos.lm import sft
    from tokenergy.models.lm import agent_from_config

    agent = agent_from_config(cfg.model, seed=cfg.seed).to(torch.device(cfg.device))
    sft(agent, cfg)
    agent.policy.save_pretrained(folder)
    agent.tokenizer.save_pretrained(folder)
    return agent


def run_tokenergy(cfg, agent) -> dict:
    from tokenergy.algos.lm import train_lm
    from tokenergy.config import apply_overrides

    cfg = apply_overrides(cfg, {"sft.episodes": 0})  # start from the SFT agent as it is
    hist = train_lm(cfg, agent=agent).history
    secs = [r["perf/rollout_s"] + r["perf/update_s"] for r in hist]
    tokens = [r["rollout/agent_tokens"] * BATCH for r in hist]
    return {
        "secs": secs,
        "tokens": tokens,
        "reward": [r["rollout/return"] for r in hist],
        "rollout_s": [r["perf/rollout_s"] for r in hist],
        "update_s": [r["perf/update_s"] for r in hist],
    }


def run_trl(cfg, folder: Path, steps: int, out: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tokenergy.envs import make
    from tokenergy.rollout import prompt_ids

    tok = AutoTokenizer.from_pretrained(folder)
    # A turn ends at </answer>, as in tokenergy's rollouts: TRL stops generating at the
    # tokenizer's eos and masks what follows it.
    tok.eos_token = "</answer>"
    env_kwargs = dict(cfg.env.kwargs)
    seeds = list(range(1000, 1000 + steps * BATCH // GROUP))
    prompts = []
    for s in seeds:
        env = make(cfg.env.name, **env_kwargs)
        obs, _ = env.reset(seed=s)
        ids = prompt_ids(tok, env, obs, cfg.rollout.instructions)
        text = tok.decode(ids, skip_special_tokens=False)
        if tok(text, add_special_tokens=False).input_ids != ids:
            raise RuntimeError(
                "the prompt does not survive decode → encode; TRL would see other ids"
            )
        prompts.append(text)

    def reward(completions, completion_ids, seed, **_):
        out = []
        for ids, s in zip(completion_ids, seed, strict=True):
            env = make(cfg.env.name, **env_kwargs)
            env.reset(seed=int(s))
            _, r, *_ = env.step(tok.decode(ids, skip_special_tokens=False))
            out.append(float(r))
        return out

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=BATCH,
        num_generations=GROUP,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=MAX_TOKENS,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="bnpo",
        scale_rewards="group",
        learning_rate=cfg.algo.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=steps,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=cfg.device == "cpu",
        seed=cfg.seed,
        shuffle_dataset=False,
    )
    # Each prompt appears GROUP times in a row: TRL's sampler repeats it num_generations times.
    ds = Dataset.from_dict({"prompt": prompts, "seed": seeds})
    trainer = GRPOTrainer(
        model=str(folder),
        reward_funcs=reward,
        args=args,
        train_dataset=ds,
        processing_class=tok,
        callbacks=[Clock()],
    )
    trainer.train()
    logs = [r for r in trainer.state.log_history if "reward" in r]
    tokens = [r["completions/mean_length"] * BATCH for r in logs]
    return {"secs": times, "tokens": tokens, "reward": [r["reward"] for r in logs]}


def _summary(runs: list[dict]) -> dict:
    """Over the repeats: every step after each run's first two."""
    secs = [x for r in runs for x in r["secs"][2:]]
    tokens = [x for r in runs for x in r["tokens"][2:]]
    return {
        "step_s": statistics.median(secs),
        "tokens_step": statistics.mean(tokens),
        "tokens_s": sum(tokens) / sum(secs),
        "final_reward": statistics.mean(x for r in runs for x in r["reward"][-10:]),
    }


def _figure(ours: dict, trl: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    for name, r, c in (("tokenergy", ours, "C0"), ("TRL GRPOTrainer", trl, "C1")):
        ax[0].plot(range(1, len(r["reward"]) + 1), r["reward"], color=c, label=name)
        ax[1].plot(range(1, len(r["secs"]) + 1), r["secs"], color=c, label=name)
    ax[0].set(xlabel="step", ylabel="mean reward of the batch", title="reward (one Sudoku move)")
    ax[1].set(xlabel="step", ylabel="seconds", title="time per step")
    ax[1].set_ylim(bottom=0)
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of each trainer")
    a = ap.parse_args()
    try:
        import trl
    except ImportError:
        sys.exit("trl is not installed: pip install -e '.[bench]' (or make bench)")
    import torch

    torch.set_num_threads(a.threads)
    cfg = _config(a.model, a.steps, a.seed, a.device, a.lr)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "start"
        print("SFT start …", flush=True)
        agent = sft_start(cfg, folder)
        runs: dict[str, list[dict]] = {"ours": [], "trl": []}
        for r in range(a.repeats):  # alternating, so both see the same machine
            print(f"tokenergy GRPO ({r + 1}/{a.repeats}) …", flush=True)
            runs["ours"].append(run_tokenergy(cfg, copy.deepcopy(agent)))
            print(f"TRL GRPOTrainer ({r + 1}/{a.repeats}) …", flush=True)
            runs["trl"].append(run_trl(cfg, folder, a.steps, Path(tmp) / f"trl{r}"))
    ours, theirs = runs["ours"][0], runs["trl"][0]  # the curves: the first repeat
    s_ours, s_trl = _summary(runs["ours"]), _summary(runs["trl"])
    figure = Path(str(FIGURE).format(device=a.device.split(":")[0]))
    _figure(ours, theirs, figure)
    lines = [
        "| trainer | s / step (median) | completion tokens / step | tokens / s | mean reward, last 10 steps |",
        "|---|---|---|---|---|",
    ]
    for name, s in (("tokenergy", s_ours), (f"TRL {trl.__version__} GRPOTrainer", s_trl)):
        lines.append(
            f"| {name} | {s['step_s']:.3f} | {s['tokens_step']:.0f} | {s['tokens_s']:,.0f} | "
            f"{s['final_reward']:+.3f} |"
        )
    ratio_tok = s_ours["tokens_s"] / s_trl["tokens_s"]
    roll = statistics.median(x for r in runs["ours"] for x in r["rollout_s"][2:])
    upd = statistics.median(x for r in runs["ours"] for x in r["update_s"][2:])
    ratio_step = s_trl["step_s"] / s_ours["step_s"]
    body = "\n".join(lines) + (
        f"\n\ntokenergy / TRL: {ratio_tok:.2f}x the tokens per second, steps {ratio_step:.2f}x "
        f"as fast. Model {a.model}, lr {a.lr:g}, {a.repeats} alternating runs of each trainer, {a.steps} steps "
        f"of {BATCH} completions (groups of {GROUP}), "
        f"at most {MAX_TOKENS} tokens each, {a.threads} torch threads, {a.device}. Reward curves: "
        f"`{figure.relative_to(ROOT)}`. tokenergy's step (medians): rollout {1000 * roll:.0f} ms "
        f"(generation and the env, which makes a Sudoku puzzle per episode as TRL's reward "
        f"function does), scoring + update {1000 * upd:.0f} ms."
    )
    print(body)
    append_results(f"GRPO: tokenergy vs TRL GRPOTrainer ({a.model}, {a.device})", body)


if __name__ == "__main__":
    main()

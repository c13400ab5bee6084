"""Data parallelism: the collectives on 2 gloo processes, and `accelerate launch` end to end."""

from __future__ import annotations

import importlib
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as tmp

from tokenergy.distributed import Parallel
from tokenergy.ops import whiten

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_single_process_is_the_identity():
    par = Parallel.from_env()
    assert not par.enabled and par.is_main
    x = torch.tensor([[1.0, 2.0, 5.0], [0.5, -1.0, 3.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    assert torch.equal(par.whiten(x, mask), whiten(x, mask))
    assert par.shard([1, 2, 3]) == [1, 2, 3]
    row = {"a": 1.5, "perf/gen_tokens_per_s": 10.0}
    assert par.average_metrics(row, 3.0) == row
    assert float(par.mean(torch.tensor([1.0, 2.0, 6.0]))) == 3.0


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
    )
    par = Parallel.from_env()
    result: dict = {"rank": par.rank, "world": par.world}
    # Process r holds rows [2r, 2r + 1] of a 4-row batch.
    full_x = torch.arange(24, dtype=torch.float32).reshape(4, 6).sin()
    full_m = torch.tensor(
        [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    ).bool()
    x, m = full_x[2 * rank : 2 * rank + 2], full_m[2 * rank : 2 * rank + 2]
    result["whiten"] = par.whiten(x, m).tolist()
    result["mean"] = float(par.mean(x.sum(1)))
    # Token-weighted gradient: the gradient of the token mean of w * x over the global batch.
    w = torch.nn.Parameter(torch.ones(6))
    loss = ((w * x) * m).sum() / m.sum()
    loss.backward()
    n_local = m.sum().float()
    par.reduce_gradients([w], float(n_local / par.sum(n_local)))
    result["grad"] = w.grad.tolist()
    result["shard"] = par.shard(list(range(8)), block=2)
    try:
        par.shard(list(range(6)), block=2)
        result["uneven"] = "accepted"
    except ValueError as e:
        result["uneven"] = str(e)
    row = {"eval/success": float(rank), "perf/gen_tokens_per_s": 100.0 * (rank + 1)}
    result["avg"] = par.average_metrics(row, weight=1.0 + rank)  # weights 1 and 2
    result["all_true"] = par.all_true(rank == 0, torch.device("cpu"))
    # What transformers does when a model class is first used, after the group exists: an
    # import that binds group.WORLD as a default argument. Leaving must still free the group
    # and stop the backend's threads (alive at interpreter exit, they abort the process).
    importlib.import_module("torch.distributed.nn.functional")
    par.close()
    if sys.platform == "linux":  # thread names from /proc
        result["gloo_threads"] = [
            n for t in os.listdir("/proc/self/task") if "gloo" in (n := _thread_name(t))
        ]
    Path(out, f"{rank}.json").write_text(json.dumps(result))


def _thread_name(tid: str) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().strip()


def test_collectives_on_two_gloo_processes(tmp_path):
    tmp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    r = [json.loads((tmp_path / f"{k}.json").read_text()) for k in range(2)]
    full_x = torch.arange(24, dtype=torch.float32).reshape(4, 6).sin()
    full_m = torch.tensor(
        [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    ).bool()
    # Whitening uses the global batch's statistics: the pieces equal the whole.
    expected = whiten(full_x, full_m)
    got = torch.tensor(r[0]["whiten"] + r[1]["whiten"])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert r[0]["mean"] == pytest.approx(float(full_x.sum(1).mean()), rel=1e-6)
    # The combined gradient is that of the token mean over all 14 tokens, on both processes.
    expected_grad = (full_x * full_m).sum(0) / full_m.sum()
    for k in range(2):
        torch.testing.assert_close(torch.tensor(r[k]["grad"]), expected_grad)
    assert r[0]["shard"] == [0, 1, 2, 3] and r[1]["shard"] == [4, 5, 6, 7]
    assert "multiple of 4" in r[0]["uneven"]
    # success 0 (weight 1) and 1 (weight 2) average to 2/3; throughputs add up.
    assert r[1]["avg"]["eval/success"] == pytest.approx(2 / 3)
    assert r[0]["avg"]["perf/gen_tokens_per_s"] == 300.0
    assert r[0]["all_true"] is False and r[1]["all_true"] is False
    if sys.platform == "linux":
        assert r[0]["gloo_threads"] == [] and r[1]["gloo_threads"] == []


def _actfocus_batch() -> tuple[torch.Tensor, ...]:
    """A 4-row batch of roles, energies, trained-token mask, log-prob inputs and advantages;
    rows 0-1 hold few, low-energy action tokens, rows 2-3 many high-energy ones, so each half's
    own statistics differ from the whole batch's."""
    from tokenergy.types import Role

    R, A, F = int(Role.REASONING), int(Role.ACTION), int(Role.FORMAT)
    roles = torch.tensor(
        [[R, R, R, A, F, 0], [R, R, A, F, 0, 0], [R, A, A, A, A, F], [A, A, A, R, A, F]]
    )
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    ).bool()
    energy = torch.arange(24, dtype=torch.float64).reshape(4, 6).cos() + torch.tensor(
        [[-2.0], [-1.5], [1.0], [2.0]], dtype=torch.float64
    )
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6).sin()
    adv = torch.arange(24, dtype=torch.float32).reshape(4, 6).cos()
    return roles, energy, mask, x, adv


def _actfocus_loss(theta, x, adv, mask, w) -> torch.Tensor:
    from tokenergy.losses import ppo_policy_loss

    loss, _ = ppo_policy_loss(theta * x, torch.zeros_like(x), adv, mask, 0.2, weights=w,
                              normalize="weights")  # fmt: skip
    return loss


def _actfocus_worker(rank: int, world: int, port: int, out: str) -> None:
    """Process r holds rows [2r, 2r + 1]: ActFocus weights with the processes' statistics, and
    the weight-normalised loss's gradient with and without :meth:`Parallel.weight_rescale`."""
    from tokenergy.energy import actfocus_weights

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                      RANK=str(rank), LOCAL_RANK=str(rank))  # fmt: skip
    par = Parallel.from_env()
    roles, energy, mask, x, adv = (t[2 * rank : 2 * rank + 2] for t in _actfocus_batch())
    result = {
        "global": actfocus_weights(roles, energy, mask, reduce_sum=par.sum).tolist(),
        "local": actfocus_weights(roles, energy, mask).tolist(),
    }
    w = torch.tensor(result["global"])
    for name, rescale in (("grad", True), ("grad_unscaled", False)):
        theta = torch.nn.Parameter(torch.ones(6))
        loss = _actfocus_loss(theta, x, adv, mask, w)
        if rescale:
            loss = loss * par.weight_rescale(mask, w)
        loss.backward()
        par.reduce_gradients([theta], par.token_share(mask))
        result[name] = theta.grad.tolist()
    par.close()
    Path(out, f"{rank}.json").write_text(json.dumps(result))


def test_actfocus_on_two_processes_is_the_one_process_actfocus(tmp_path):
    """The paper's weights take mu and sigma over the global batch's action tokens, and the
    loss divided by the weights' sum has the whole batch's gradient, on 2 gloo processes."""
    from tokenergy.energy import actfocus_weights

    tmp.spawn(_actfocus_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    r = [json.loads((tmp_path / f"{k}.json").read_text()) for k in range(2)]
    roles, energy, mask, x, adv = _actfocus_batch()
    whole = actfocus_weights(roles, energy, mask)
    torch.testing.assert_close(torch.tensor(r[0]["global"] + r[1]["global"]), whole)
    # Each half alone would centre its own action tokens: different weights.
    local = torch.tensor(r[0]["local"] + r[1]["local"])
    assert float((local - whole).abs().max()) > 0.05
    theta = torch.nn.Parameter(torch.ones(6))
    _actfocus_loss(theta, x, adv, mask, whole).backward()
    for k in range(2):
        torch.testing.assert_close(torch.tensor(r[k]["grad"]), theta.grad)
    # Without the rescale the token-share average of the halves' gradients is another one.
    unscaled = torch.tensor(r[0]["grad_unscaled"])
    assert float((unscaled - theta.grad).abs().max()) > 1e-3


# A launch that fails on the network (a port taken between choosing it and binding it) is
# retried with a new port; any other failure fails the test at once.
_NETWORK = ("EADDRINUSE", "Address already in use", "DistNetworkError", "Connection refused")


def _train(args: list[str], out: Path, launcher, threads: int = 2) -> None:
    """``launcher()`` gives the command prefix (a fresh port for each try)."""
    for attempt in range(3):
        cmd = [*launcher(), "-m", "tokenergy.cli", "train", str(ROOT / "configs/sokoban-ppo.yaml")]
        res = subprocess.run(
            [*cmd, "--out", str(out), *args, *(["--overwrite"] if attempt else [])],
            capture_output=True,
            text=True,
            timeout=600,  # a hang guard: beside training runs on 2 cores a run takes minutes
            env={**os.environ, "OMP_NUM_THREADS": str(threads)},
        )
        if res.returncode == 0 or not any(m in res.stderr for m in _NETWORK):
            break
    assert res.returncode == 0, (
        f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    )


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted((run / "agent").rglob("*.safetensors")):
        out.update({f"{f.relative_to(run)}:{k}": v for k, v in load_file(f).items()})
    return out


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_accelerate_launch_two_processes_make_the_single_process_update(tmp_path):
    """An SFT step and an ActFocus-PPO iteration on 8 episodes: 1 process, and 2 processes of
    4 each.

    The start is an agent that already writes answers of varying length (so the processes
    hold different numbers of trained tokens); near-greedy rollouts (temperature 1e-6,
    noiseless SFT data) make the global batch the same in both runs, and one minibatch makes
    the update a function of the batch alone. The combined update must match.
    """
    # Tree search (2 levels, 4 leaf visits): an episode ends at the goal or after the budget,
    # so episodes differ in length with their outcome.
    env = "--env.name tree_search --env.max_turns 4 --log.progress false --device cpu"
    env += " --algo.critic_warmup_iters 0"  # the preset's warm-up would hold the policy still
    base = shlex.split(f"{env} --sft.episodes 256 --sft.epochs 8 --sft.batch_size 16 --sft.lr 0.01")
    base += shlex.split("--algo.iterations 1 --rollout.episodes 8 --eval.episodes 4")
    _train(base, tmp_path / "base", lambda: [sys.executable], threads=1)  # the common start
    args = shlex.split(
        f"{env} --model.path {tmp_path / 'base' / 'agent'} "
        "--sft.episodes 16 --sft.epochs 1 --sft.batch_size 16 --sft.epsilon 0 "
        "--rollout.episodes 8 --rollout.temperature 0.000001 "
        "--algo.iterations 1 --algo.epochs 2 --algo.minibatches 1 "
        "--eval.episodes 4 --eval.every 1 "
        # the paper's ActFocus: batch statistics and the weights' sum of the global batch
        "--energy.weighting actfocus --energy.source ref_free_energy --algo.loss_normalize weights"
    )
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    _train(args, tmp_path / "one", lambda: [sys.executable])
    launch = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    launch += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port"]
    _train(args, tmp_path / "two", lambda: [*launch, str(_free_port())], threads=1)

    one, two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    rl_one = next(r for r in one if r.get("train/iteration") == 1)
    rl_two = next(r for r in two if r.get("train/iteration") == 1)
    assert rl_two["train/episodes"] == rl_one["train/episodes"] == 8
    # The episodes differ in length, so an unweighted average of the processes' gradients
    # would not be the global one.
    assert rl_one["rollout/agent_tokens_std"] > 0
    assert rl_two["rollout/agent_tokens"] == pytest.approx(rl_one["rollout/agent_tokens"])
    # The pre-clip norm of the combined gradient is the single process's, up to float32 sums
    # taken in another order. It is the policy's own norm (a separate critic is clipped apart),
    # ~0.3 where the joint one was ~10, so the same absolute noise is a larger share of it
    # (measured: 2.2e-4 relative; 3.4e-5 for the joint norm).
    assert rl_two["train/grad_norm"] == pytest.approx(rl_one["train/grad_norm"], rel=1e-3)
    assert rl_two["rollout/return"] == pytest.approx(rl_one["rollout/return"], abs=1e-6)
    # ActFocus weighted the tokens, and alike: the share of the weight on action tokens is the
    # one process's (each process's own batch statistics would tilt it).
    assert rl_one["weights/max"] > 1.0
    assert rl_two["weights/action"] == pytest.approx(rl_one["weights/action"], rel=1e-2)
    # The weights moved the same way from the common start (base/agent): the two updates
    # differ by float noise only (Adam's first steps blow a near-zero gradient up to a full
    # step, so a few entries differ more than the rest; the norm of the difference is small).
    start, wa, wb = (_weights(tmp_path / d) for d in ("base", "one", "two"))
    assert wa.keys() == wb.keys() == start.keys()
    step_one = torch.cat([(wa[k] - start[k]).flatten() for k in wa])
    step_two = torch.cat([(wb[k] - start[k]).flatten() for k in wa])
    assert step_one.numel() > 100_000 and float(step_one.norm()) > 0
    rel = float((step_two - step_one).norm() / step_one.norm())
    assert rel < 1e-3  # measured: 8e-5
    # Only rank 0 wrote the run folder: one row per logged step, no duplicates.
    assert [r["train/global_step"] for r in two] == [r["train/global_step"] for r in one]


def test_what_processes_cannot_share_is_refused_before_any_work():
    from test_lm import tiny_cfg
    from tokenergy.algos.lm import _check_parallel

    two = Parallel(rank=0, world=2)
    _check_parallel(tiny_cfg(), two)  # 4 episodes, 2 minibatches: 2 episodes per process
    cases = [
        ({"rollout.episodes": 6, "algo.minibatches": 1}, Parallel(0, 4), "multiple of 4"),
        ({"rollout.replay_ratio": 0.5}, two, "success replay"),
        ({"energy.source": "discriminator", "energy.weighting": "bottleneck"}, two, "single"),
        ({"sft.episodes": 5, "sft.batch_size": 4}, two, "sft.episodes 5"),
        ({"rollout.episodes": 4, "algo.minibatches": 4}, two, "cannot fill"),
    ]
    for over, par, message in cases:
        with pytest.raises(ValueError, match=message):
            _check_parallel(tiny_cfg(**over), par)

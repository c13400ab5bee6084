"""Crash safety: a killed run resumes from its newest complete checkpoint, and on CPU a resumed
run equals an uninterrupted one."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_ppo import small
from tokenergy.experiments import run_training
from tokenergy.runs import latest_checkpoint, load_checkpoint, read_metrics

CLI = [sys.executable, "-m", "tokenergy.cli"]


def _rows(run_dir):
    return [
        {k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_metrics(run_dir)
    ]


def test_resume_equals_the_straight_run(tmp_path):
    cfg = small(
        **{"ppo.total_steps": 4 * 32 * 10, "log.checkpoint_every": 5, "log.tensorboard": False}
    )
    run_training(cfg, tmp_path / "straight")
    run_training(cfg, tmp_path / "crashed")
    # the crash: the last checkpoint never got written, and half a metrics line is left
    shutil.rmtree(tmp_path / "crashed" / "checkpoints" / "iter_000010")
    with open(tmp_path / "crashed" / "metrics.jsonl", "a") as f:
        f.write('{"train/iteration": 11, "rollout/ret')
    result = run_training(cfg, tmp_path / "crashed", resume=True)
    assert _rows(tmp_path / "crashed") == _rows(tmp_path / "straight")
    assert [r["train/iteration"] for r in result.history] == list(range(1, 11))
    assert latest_checkpoint(tmp_path / "crashed").name == "iter_000010"


def test_sigkill_mid_run_then_resume(tmp_path):
    out = tmp_path / "run"
    args = [
        "train",
        "--env",
        "test/Identity-v0",
        "--env.num-envs",
        "4",
        "--ppo.num-steps",
        "32",
        "--ppo.total-steps",
        str(4 * 32 * 100),
        "--ppo.minibatches",
        "2",
        "--log.checkpoint-every",
        "3",
        "--log.keep-checkpoints",
        "2",
        "--log.progress",
        "false",
        "--log.tensorboard",
        "false",
    ]
    code = "import tests_identity_env; from tokenergy.cli import main; main()"
    env_setup = tmp_path / "tests_identity_env.py"
    here = str(Path(__file__).parent)
    env_setup.write_text(
        f"import sys; sys.path.insert(0, {here!r}); import test_ppo  # test/Identity-v0\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, *args, "--out", str(out)], cwd=tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline:
        rows = read_metrics(out) if (out / "metrics.jsonl").is_file() else []
        if len(rows) >= 8:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_at_kill = max(r["train/iteration"] for r in read_metrics(out))
    assert done_at_kill < 100  # it really was killed mid-run
    for ckpt in (out / "checkpoints").glob("iter_*"):
        load_checkpoint(ckpt)  # every complete-looking checkpoint loads
    last = int(json.loads((latest_checkpoint(out) / "state.json").read_text())["iteration"])
    assert done_at_kill - last <= 3  # at most one checkpoint interval of work lost
    res = subprocess.run(
        [sys.executable, "-c", code, "train", "--resume", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    its = [r["train/iteration"] for r in read_metrics(out)]
    assert its == list(range(1, 101))


# The credit variant carries state across iterations (a learned discriminator and its
# optimizer, the β controller, the diagnostic's generator): resume must restore all of it.
CREDIT = {
    "energy.source": "discriminator",
    "energy.weighting": "actfocus",
    "energy.shuffle": True,
    "energy.reward_beta": 0.2,
    "energy.beta_patience": 1,
    "eval.diagnose_seeds": 2,
    "eval.diagnose_group": 2,
}


KIT = {  # the robustness kit's state: the replay buffer, the curriculum level, the best agent
    "rollout.replay_ratio": 0.5,
    "env.curriculum_kwarg": "map_size",
    "env.curriculum_values": [3, 4],
    "env.curriculum_threshold": 0.0,
    "env.curriculum_window": 3,
    "algo.clip_eps_final": 0.1,
    "algo.ent_coef_final": 0.0,
    "algo.lr_final": 1e-5,
    "eval.keep_best": True,
    "model.train_top_blocks": 1,
}


# The envelope's state: the KL controller, the target value head (here of a separate critic),
# the curiosity model and the ratio-cap count; the anchor's draws.
ENVELOPE = {
    "algo.kl_target": 0.001,
    "model.critic": "separate",
    "algo.kl_horizon": 8,
    "algo.value_target_tau": 0.3,
    "algo.reward_whiten": True,
    "algo.sft_coef": 0.5,
    "algo.sft_coef_final": 0.1,
    "rollout.curiosity_coef": 0.05,
}


@pytest.mark.parametrize(
    "extra", [{}, CREDIT, KIT, ENVELOPE], ids=["plain", "credit", "kit", "envelope"]
)
def test_lm_resume_equals_the_straight_run(tmp_path, extra):
    from test_lm import tiny_cfg

    cfg = tiny_cfg(
        **{
            "sft.episodes": 8,
            "sft.batch_size": 4,
            "algo.iterations": 4,
            "algo.ent_coef": 0.01,
            "eval.every": 2,
            **extra,
        }
    )
    cfg.log.checkpoint_every = 2
    run_training(cfg, tmp_path / "straight")
    run_training(cfg, tmp_path / "crashed")
    shutil.rmtree(tmp_path / "crashed" / "checkpoints" / "iter_000004")
    shutil.rmtree(tmp_path / "crashed" / "agent")
    result = run_training(cfg, tmp_path / "crashed", resume=True)
    assert _rows(tmp_path / "crashed") == _rows(tmp_path / "straight")
    assert [r["train/iteration"] for r in result.history] == [1, 2, 3, 4]
    assert (tmp_path / "crashed" / "agent" / "policy" / "config.json").is_file()
    if extra is KIT:  # the curriculum's window (3 iterations) filled across the checkpoint
        assert [r["train/curriculum_level"] for r in result.history] == [0, 0, 0, 1]


def test_full_disk_is_a_clear_error_and_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    import errno

    import pytest

    import tokenergy.runs as runs

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runs, "save_file", full)
    cfg = small(**{"ppo.total_steps": 4 * 32 * 2, "log.tensorboard": False})
    with pytest.raises(
        runs.RunDirError, match=r"cannot write checkpoint .*iter_000002.*No space left"
    ):
        run_training(cfg, tmp_path / "r")
    assert not list((tmp_path / "r" / "checkpoints").iterdir())  # no iter_*, no .tmp-*


def test_resume_without_a_checkpoint_or_with_a_corrupt_one(tmp_path):
    cfg = small(**{"ppo.total_steps": 4 * 32 * 2, "log.tensorboard": False})
    run_training(cfg, tmp_path / "r")
    res = subprocess.run(
        [*CLI, "train", "--resume", str(tmp_path / "nothing")], capture_output=True, text=True
    )
    assert res.returncode == 2 and "nothing" in res.stderr and "Traceback" not in res.stderr
    ckpt = latest_checkpoint(tmp_path / "r")
    (ckpt / "trainer.pt").write_bytes(b"\x00 not a checkpoint")
    code = "import sys; sys.path.insert(0, 'tests'); import test_ppo; from tokenergy.cli import main; main()"
    res = subprocess.run(
        [sys.executable, "-c", code, "train", "--resume", str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "trainer.pt" in res.stderr and "corrupt" in res.stderr

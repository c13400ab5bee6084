"""The command line: every --help, one-line errors with exit code 2, a tiny end-to-end run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tokenergy.runs import latest_checkpoint, load_checkpoint

CLI = [sys.executable, "-m", "tokenergy.cli"]
SOKOBAN = Path(__file__).parent.parent / "configs" / "sokoban-ppo.yaml"
TINY = [
    "--ppo.total-steps",
    "512",
    "--ppo.num-steps",
    "32",
    "--env.num-envs",
    "4",
    "--ppo.minibatches",
    "2",
]


def run(*args, cwd=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def run_here(capsys, monkeypatch, *args, cwd=None):
    """The console script's ``main`` in this process (no interpreter start per call): its exit
    code, stdout and stderr. The entry point itself is run as a subprocess by the tests below."""
    from types import SimpleNamespace

    from tokenergy.cli import main

    if cwd is not None:
        monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["tokenergy", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


@pytest.mark.parametrize(
    "cmd",
    [
        [],
        ["train"],
        ["ablate"],
        ["report"],
        ["config"],
        ["eval"],
        ["play"],
        ["diagnose"],
        ["search"],
    ],
)
def test_help(cmd, capsys, monkeypatch):
    res = run_here(capsys, monkeypatch, *cmd, "--help")
    assert res.returncode == 0, res.stderr
    assert "Usage" in res.stdout


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (
            ["config", "--ppo.clip-esp", "0.1"],
            "ppo.clip_esp: unknown key; did you mean 'clip_eps'?",
        ),
        (["config", "--ppo.clip-eps", "2"], "ppo.clip_eps: must be in (0, 1), got 2.0"),
        (["config", "--ppo.epochs", "many"], "ppo.epochs: must be int, got 'many' (str)"),
        (["train", "missing.yaml"], "config file 'missing.yaml' not found"),
        (["report", "no-such-dir"], "'no-such-dir' is not a folder"),
        (
            ["config", str(SOKOBAN), "--energy.alpha", "1.5"],
            "energy.alpha: must be in [0, 1], got 1.5",
        ),
        (
            ["config", str(SOKOBAN), "--energy.beta", "-1"],
            "energy.beta: must be in [0, inf], got -1.0",
        ),
        (
            ["ablate", str(SOKOBAN.parent / "actfocus-paper.yaml"), "--only", "chess/*"],
            "--only chess/*: no run of the plan matches",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, text, tmp_path, capsys, monkeypatch):
    res = run_here(capsys, monkeypatch, *args, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.startswith(f"error: {text}")
    assert len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.stderr


def test_the_entry_point_reports_bad_input_in_one_line(tmp_path):
    """Through the interpreter, as a user runs it: the one-line error and exit code 2."""
    res = run("config", "--ppo.clip-esp", "0.1", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.startswith("error: ppo.clip_esp: unknown key; did you mean 'clip_eps'?")
    assert len(res.stderr.strip().splitlines()) == 1


def test_debug_shows_traceback(tmp_path):
    res = subprocess.run(
        [*CLI, "--debug", "config", "--ppo.clip-eps", "2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert res.returncode != 0 and "Traceback" in res.stderr


def test_train_end_to_end_writes_a_complete_run(tmp_path):
    out = tmp_path / "run"
    res = run("train", "--env", "CartPole-v1", "--out", str(out), "--ppo.clip-eps", "0.1", *TINY)
    assert res.returncode == 0, res.stderr
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["env"]["id"] == "CartPole-v1" and cfg["ppo"]["clip_eps"] == 0.1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/global_step"] for r in rows] == [128, 256, 384, 512]
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tb").iterdir())
    state_dict, ckpt_cfg, state = load_checkpoint(latest_checkpoint(out))
    assert state["iteration"] == 4 and ckpt_cfg.env.id == "CartPole-v1"
    assert "actor.0.weight" in state_dict
    assert not list((out / "checkpoints").glob(".tmp-*"))
    # a second run into the same folder is refused rather than mixed in
    res = run("train", "--env", "CartPole-v1", "--out", str(out), *TINY)
    assert res.returncode == 2 and "already exists" in res.stderr
    res = run("report", str(out))
    assert res.returncode == 0, res.stderr
    assert (out / "report" / "curves.png").stat().st_size > 1000


def test_ablate_then_report(tmp_path):
    out = tmp_path / "abl"
    res = run(
        "ablate",
        "configs/bottleneck.yaml",
        "--seeds",
        "2",
        "--jobs",
        "2",  # the process pool, its progress queue and its workers' exit-with-parent watch
        "--out",
        str(out),
        *TINY,
        cwd=None,
    )
    assert res.returncode == 0, res.stderr
    for variant in ("ppo", "energy", "shuffled"):
        for k in (0, 1):
            cfg = yaml.safe_load((out / variant / f"seed_{k}" / "config.yaml").read_text())
            assert cfg["seed"] == k
            assert cfg["energy"]["weighting"] == ("none" if variant == "ppo" else "bottleneck")
            assert cfg["energy"]["shuffle"] == (variant == "shuffled")
    md = (out / "report" / "report.md").read_text()
    for variant in ("ppo", "energy", "shuffled"):
        assert f"| {variant} | " in md
    html = (out / "report" / "report.html").read_text()
    assert "data:image/png;base64," in html
    assert "report.html" in res.stdout


LM_TINY = [
    "--model.size",
    "tiny",
    "--sft.episodes",
    "16",
    "--sft.epochs",
    "1",
    "--sft.batch-size",
    "8",
    "--rollout.episodes",
    "8",
    "--algo.iterations",
    "2",
    "--algo.minibatches",
    "2",
    "--env.max-turns",
    "3",
    "--eval.episodes",
    "8",
    "--log.tensorboard",
    "false",
]


def test_lm_train_then_eval_end_to_end(tmp_path):
    out = tmp_path / "lm"
    res = run("train", "configs/sokoban-grpo.yaml", "--out", str(out), *LM_TINY,
              "--log.progress", "false", "--threads", "1")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "held-out success" in res.stdout
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["kind"] == "lm" and cfg["algo"]["name"] == "grpo" and cfg["model"]["size"] == "tiny"
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/iteration"] for r in rows if "train/iteration" in r] == [0, 1, 2]
    res = run("eval", str(out), "--episodes", "4")
    assert res.returncode == 0, res.stderr
    result = json.loads((out / "eval.json").read_text())
    assert 0.0 <= result["eval/success"] <= 1.0 and result["eval/turns"] >= 1
    p = result["eval/success"]
    assert result["eval/success_se"] == pytest.approx((p * (1 - p) / 4) ** 0.5)
    # the config's evaluation (the paper's: temperature 0.5 over 32 held-out maps) and held-out
    # seeds, the episodes asked for
    want = {"episodes": 4, "temperature": 0.5, "seed_offset": cfg["eval"]["seed_offset"]}
    assert result["settings"] == {**want, "maps": 32} and cfg["eval"]["temperature"] == 0.5
    res = run("search", str(out), "--algo", "beam", "--episodes", "2", "--width", "2")
    assert res.returncode == 0, res.stderr
    rows = json.loads((out / "search-beam.json").read_text())
    assert [r["method"] for r in rows] == ["greedy", "sampled", "beam (width 2, c 1)"]
    res = run("diagnose", str(out), "--now", "--seeds", "3", "--group", "2",
              "--reference", str(out / "agent"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (out / "report" / "diagnose.png").is_file() and "action" in res.stdout
    table = (out / "report" / "diagnose.md").read_text()
    assert "energy rho, action" in table and "| 3 |" in table  # the paper's, over 3 groups
    kept = json.loads((out / "report" / "diagnose_now.json").read_text())  # for the study report
    assert kept["diag/energy_groups"] == 3 and (kept["seeds"], kept["group"]) == (3, 2)
    assert kept["reference"] == str(out / "agent") and "diag/energy_spearman_action" in kept
    res = run("report", str(out))
    assert res.returncode == 0, res.stderr
    assert "per-token pictures" in res.stdout and (out / "report" / "tokens.html").is_file()


def test_lm_errors_are_one_line(tmp_path):
    res = run("train", "configs/sokoban-grpo.yaml", "--rollout.group-size", "1")
    assert res.returncode == 2 and "rollout.group_size: GRPO needs at least 2" in res.stderr
    assert "Traceback" not in res.stderr
    res = run(
        "train",
        "configs/sokoban-ppo.yaml",
        "--model.path",
        str(tmp_path),
        *LM_TINY,
        "--out",
        str(tmp_path / "x"),
    )
    assert res.returncode == 2 and "no config.json" in res.stderr and str(tmp_path) in res.stderr
    res = run("eval", str(tmp_path))
    assert res.returncode == 2 and "config.yaml" in res.stderr


def test_play_in_the_terminal():
    script = "bogus\nsolver\nRight\nquit\n"
    res = subprocess.run(
        [*CLI, "play", "frozenlake", "--seed", "0", "--map-size", "4"],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "(invalid)" in res.stdout and "<answer>" in res.stdout
    res = subprocess.run(
        [*CLI, "play", "sokoban", "--level", '["#######", "#P_X_O#", "#######"]'],
        input="Right\nRight\nRight\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and "solved after 3 moves" in res.stdout, res.stdout + res.stderr


def test_unwritable_run_folder_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    res = run("train", *TINY, "--out", str(blocker / "run"))
    assert res.returncode == 2 and "cannot write run folder" in res.stderr
    assert str(blocker / "run") in res.stderr and "Traceback" not in res.stderr

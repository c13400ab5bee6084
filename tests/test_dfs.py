"""Learning to search: the batched tree task, the one-layer search transformer, the
hand-set depth-first construction, REINFORCE with a depth curriculum, and search-eval."""

import math

import numpy as np
import pytest
import torch

from tokenergy.algos.dfs import (
    SearchTransformer,
    TreeBatch,
    dfs_weights,
    evaluate_search,
    log_probs,
    play,
    random_dfs_leaves,
    random_moves_leaves,
    random_moves_success,
    train_dfs,
)
from tokenergy.config import ConfigError, config_from_dict
from tokenergy.envs import make


def test_tree_batch_follows_the_text_env_move_for_move():
    goal = (1, 0, 1)
    moves = [0, 0, 0, 0, 1, 1, 1, 0, 1]  # leaves (0,0,0), (0,1,1), (1,0,1) = the goal
    env = make("tree_search", k=2, depth=3, gamma=0.9)
    env.reset(seed=0, options={"goal": goal})
    batch = TreeBatch(2, 3, 1, gamma=0.9, goals=torch.tensor([goal]))
    for m in moves:
        _, r, term, _, _ = env.step(f"<answer>{m + 1}</answer>")
        batch.step(torch.tensor([m]))
    assert term and bool(batch.done[0]) and bool(batch.found[0])
    assert batch.reward[0].item() == pytest.approx(r) == pytest.approx(0.9**8)
    assert batch.leaves[0] == env.visited == [(0, 0, 0), (0, 1, 1), (1, 0, 1)]
    # BOS, then each attempt's moves and a FAIL after the two wrong leaves
    L = int(batch.length[0])
    assert batch.tokens[0, :L].tolist() == [3, 0, 0, 0, 2, 0, 1, 1, 2, 1, 0, 1]
    assert batch.depths[0, :L].tolist() == [0, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    assert batch.attempts[0, :L].tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]


def test_budget_ends_an_episode_without_the_goal():
    batch = TreeBatch(2, 1, 1, budget=2, goals=torch.tensor([[1]]))
    batch.step(torch.tensor([0]))
    batch.step(torch.tensor([0]))
    assert bool(batch.done[0]) and not bool(batch.found[0]) and batch.reward[0] == 0


@pytest.mark.parametrize(("k", "depths"), [(2, [1, 2, 3, 4, 5, 6]), (3, [1, 2, 3, 4])])
def test_hand_set_two_heads_search_depth_first_at_every_depth(k, depths):
    model = SearchTransformer(k, heads=2)
    dfs_weights(model)
    for row in evaluate_search(model, k, depths, episodes=48, greedy=True):
        assert row["success"] == 1.0 and row["revisit_rate"] == 0.0, row
        assert row["ranked_share"] == 1.0  # children tried in index order at every node
    # the order of leaves is exactly the odometer 00..0, 00..1, ...
    env = play(model, k, 3, 1, torch.Generator(), greedy=True, goals=torch.full((1, 3), k - 1))
    want = [tuple(int(x) for x in np.base_repr(i, k).zfill(3)) for i in range(k**3)]
    assert env.leaves[0] == want


def test_mean_leaves_of_a_perfect_search_match_randomized_dfs():
    model = SearchTransformer(2, heads=2)
    dfs_weights(model)
    (row,) = evaluate_search(model, 2, [4], episodes=2000, greedy=True)
    assert random_dfs_leaves(2, 4) == 8.5
    assert abs(row["leaves"] - 8.5) < 3 * row["leaves_se"]


def test_uniformly_random_moves_by_hand_and_by_sampling():
    # depth 1 of a binary tree, 2 visits: the first finds the goal half the time, the second
    # (taken half the time) too: success 3/4, leaves 1 + 1/2
    assert random_moves_success(2, 1) == pytest.approx(0.75)
    assert random_moves_leaves(2, 1) == pytest.approx(1.5)
    assert random_moves_success(2, 2) == pytest.approx(1 - (3 / 4) ** 4)
    assert random_moves_success(2, 12) == pytest.approx(1 - math.exp(-1), abs=1e-4)
    model = SearchTransformer(2, heads=2, init_scale=0.0)  # every logit 0: uniform moves
    n = 4000
    (row,) = evaluate_search(model, 2, [3], episodes=n)
    p = random_moves_success(2, 3)
    assert abs(row["success"] - p) < 3 * math.sqrt(p * (1 - p) / n)
    assert abs(row["leaves"] - random_moves_leaves(2, 3)) < 3 * row["leaves_se"]


def test_log_probs_of_a_batch_match_the_step_by_step_decisions():
    model = SearchTransformer(3, heads=2, init_scale=0.5, seed=1)
    gen = torch.Generator().manual_seed(0)
    env = play(model, 3, 2, 6, gen)
    lp, ent, valid = log_probs(model, env)
    # replay the first episode one decision at a time
    b = 0
    moves = [t for t in env.tokens[b, : int(env.length[b])].tolist() if t < 3]
    assert int(valid[b].sum()) == len(moves)
    replay = TreeBatch(3, 2, 1, goals=env.goals[b : b + 1])
    for i, m in enumerate(moves):
        L = int(replay.length[0])
        logits = model(replay.tokens[:, :L], replay.depths[:, :L], replay.attempts[:, :L],
                       torch.tensor([[L - 1]]), replay.decision_depth()[:, None],
                       replay.attempt[:, None])[0, 0]  # fmt: skip
        assert lp[b, i].item() == pytest.approx(torch.log_softmax(logits, -1)[m].item(), abs=1e-5)
        replay.step(torch.tensor([m]))
    assert (ent[valid] > 0).all()


def test_unseen_depth_rows_of_the_embedding_stay_zero_after_training():
    cfg = config_from_dict({"kind": "dfs", "train": {"iterations": [5, 5], "batch": 16}})
    model = train_dfs(cfg).model
    assert model.e[:, 3 : model.max_depth + 1].abs().sum() == 0  # depths 3+ never trained
    assert model.e[:, 1:3].abs().sum() > 0


def test_reinforce_learns_depth_one():
    cfg = config_from_dict(
        {"kind": "dfs", "tree": {"k": 3}, "train": {"depths": [1], "iterations": [150]}}
    )
    untrained = SearchTransformer(3, 2, init_scale=cfg.model.init_scale, seed=cfg.seed)
    (before,) = evaluate_search(untrained, 3, [1], episodes=256)
    (row,) = evaluate_search(train_dfs(cfg).model, 3, [1], episodes=256)
    assert before["revisit_rate"] > 0.2  # a random policy picks a tried child often
    assert row["revisit_rate"] < 0.05 and row["success"] > 0.95
    assert row["leaves"] < before["leaves"]


def test_dfs_config_errors():
    with pytest.raises(ConfigError, match=r"train\.iterations"):
        config_from_dict({"kind": "dfs", "train": {"depths": [1, 2], "iterations": [10]}})
    with pytest.raises(ConfigError, match=r"tree\.k"):
        config_from_dict({"kind": "dfs", "tree": {"k": 12}})
    with pytest.raises(ConfigError, match=r"model\.window"):
        config_from_dict({"kind": "dfs", "model": {"window": 0}})
    with pytest.raises(ConfigError, match=r"train\.batch: 10 episodes do not split over the 3"):
        config_from_dict({"kind": "dfs", "train": {"depths": [[1, 2, 3]], "iterations": [5],
                                                   "batch": 10}})  # fmt: skip
    with pytest.raises(ConfigError, match=r"train\.depths"):
        config_from_dict({"kind": "dfs", "train": {"depths": [[]], "iterations": [5]}})
    with pytest.raises(ConfigError, match=r"train\.budget_frac"):
        config_from_dict({"kind": "dfs", "train": {"budget_frac": 0.0}})


def test_training_budget_is_a_share_of_the_leaves_at_least_one():
    from tokenergy.algos.dfs import training_budget

    assert training_budget(2, 3, 0.5) == 4
    assert training_budget(3, 2, 0.5) == 5  # ceil(4.5)
    assert training_budget(3, 2, 0.01) == 1
    assert training_budget(2, 4, None) is None


def test_a_mixed_stage_plays_each_depth_in_the_same_batch(monkeypatch):
    import tokenergy.algos.dfs as dfs

    played = []
    real_play = dfs.play

    def spy(model, k, depth, episodes, gen, **kw):
        played.append((depth, episodes, kw.get("budget")))
        return real_play(model, k, depth, episodes, gen, **kw)

    monkeypatch.setattr(dfs, "play", spy)
    cfg = config_from_dict(
        {
            "kind": "dfs",
            "train": {"depths": [1, [1, 2]], "iterations": [1, 2], "batch": 16, "budget_frac": 0.5},
        }
    )
    hist = train_dfs(cfg).history
    # stage 1: one batch of depth 1; stage 2: half the batch at depth 1, half at depth 2,
    # each with half its leaves as budget (1 of 2, 2 of 4)
    assert played == [(1, 16, 1), (1, 8, 1), (2, 8, 2), (1, 8, 1), (2, 8, 2)]
    assert [r["train/depth"] for r in hist] == [1, 2, 2]
    assert all(r["rollout/leaves"] <= 2 for r in hist)  # no episode passes its budget


def test_search_eval_cli_writes_the_table_and_the_attention_picture(tmp_path):
    from typer.testing import CliRunner

    from tokenergy.cli import app

    runner = CliRunner()
    out = tmp_path / "run"
    preset = tmp_path / "dfs.yaml"
    preset.write_text("kind: dfs\ntrain: {iterations: [3, 3], batch: 8}\nlog: {progress: false}\n")
    res = runner.invoke(app, ["train", str(preset), "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["search-eval", str(out), "--depths", "3", "--episodes", "8"])
    assert res.exit_code == 0, res.output
    md = (out / "search_eval.md").read_text()
    assert md.splitlines()[2].startswith("| 3 |")
    assert (out / "attention.png").stat().st_size > 1000
    assert math.isfinite(float(md.splitlines()[2].split("|")[2]))
    # the hand-set construction on the same task: sampled moves, still depth-first
    res = runner.invoke(app, ["search-eval", str(out), "--hand-set", "--depths", "4",
                              "--episodes", "32"])  # fmt: skip
    assert res.exit_code == 0, res.output
    row = (out / "search_eval_hand_set.md").read_text().splitlines()[2].split("|")
    assert row[2].strip() == "1.000" and row[5].strip() == "0.000"  # success, revisit rate


def test_head_ablation_scores_every_run_with_search_eval(tmp_path):
    from typer.testing import CliRunner

    from tokenergy.cli import app

    preset = tmp_path / "dfs.yaml"
    preset.write_text(
        "kind: dfs\ntrain: {iterations: [2, 2], batch: 8}\neval: {depths: [3], episodes: 8}\n"
        "log: {progress: false}\n"
    )
    out = tmp_path / "abl"
    res = CliRunner().invoke(app, ["ablate", str(preset), "--seeds", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    lines = (out / "search_ablation.md").read_text().splitlines()
    assert [ln.split("|")[1].strip() for ln in lines[2:]] == [
        "1-head", "2-heads", "4-heads", "randomized DFS", "uniformly random moves"
    ]  # fmt: skip
    assert all(ln.split("|")[2].strip() == "2" for ln in lines[2:5])  # two seeds each
    assert lines[-2].endswith("1.00 / 4.5 |")  # depth 3: (2^3 + 1) / 2 leaves
    # depth 3: 1 - (7/8)^8 = 0.656 success, 0.656 x 8 = 5.25 leaves
    assert lines[-1].endswith("0.66 / 5.3 |")
    assert (out / "search_ablation.png").stat().st_size > 1000
    assert (out / "2-heads" / "seed_1" / "search_eval.md").is_file()


def test_same_seed_same_run_with_two_threads():
    """With two CPU threads the value table's gradient (an indexed read's backward) summed in
    a varying order; training runs under deterministic kernels, so two runs of one seed give
    identical metrics, and the setting outside training is left as it was."""
    import torch

    from tokenergy.algos.dfs import deterministic_kernels

    cfg = config_from_dict(
        {"kind": "dfs", "train": {"depths": [1, 2], "iterations": [5, 40], "batch": 128}}
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = [train_dfs(cfg).history for _ in range(2)]
    finally:
        torch.set_num_threads(before)
    drop = {"perf/elapsed_s"}
    a, b = ([{k: v for k, v in r.items() if k not in drop} for r in h] for h in runs)
    assert a == b
    assert not torch.are_deterministic_algorithms_enabled()
    with deterministic_kernels():
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()


def _keys():
    """One episode's keys for k = 2: BOS, moves 0@1 1@2, FAIL, move 1@1; decisions at depths
    1 and 2 after the last key."""
    tokens = torch.tensor([[3, 0, 1, 2, 1]])
    depths = torch.tensor([[0, 1, 2, 3, 1]])
    return tokens, depths, torch.tensor([[1, 2]])


def test_relative_depth_score_is_a_slope_on_the_depth_difference_of_moves():
    model = SearchTransformer(2, heads=2, depth_features="relative")
    tokens, depths, q_depth = _keys()
    assert model.depth_score(tokens, depths, q_depth).abs().sum() == 0  # starts at zero
    with torch.no_grad():
        model.slope.copy_(torch.tensor([1.0, -2.0]))
    s = model.depth_score(tokens, depths, q_depth)  # (B, H, Q, T)
    # key depth minus decision depth for the moves (0@1, 1@2, 1@1); BOS and FAIL give 0
    delta = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0, -1.0]])
    assert torch.equal(s[0, 0], delta) and torch.equal(s[0, 1], -2 * delta)


def test_sinusoidal_depth_score_projects_sines_and_cosines_of_the_difference():
    from tokenergy.algos.dfs import N_SINES

    model = SearchTransformer(2, heads=1, depth_features="sinusoidal")
    tokens, depths, q_depth = _keys()
    with torch.no_grad():
        model.sines.copy_(torch.arange(1.0, 2 * N_SINES + 1)[None])
    s = model.depth_score(tokens, depths, q_depth)[0, 0].detach()
    freq = 2.0 ** -torch.arange(N_SINES, dtype=torch.float)
    w = torch.arange(1.0, 2 * N_SINES + 1)
    for q, dq in enumerate((1, 2)):
        for t in range(5):
            if tokens[0, t] >= 2:  # BOS and FAIL: no depth
                assert s[q, t] == 0
                continue
            a = (depths[0, t] - dq) * freq
            want = (torch.cat([torch.sin(a), torch.cos(a)]) * w).sum()
            assert s[q, t] == pytest.approx(float(want), abs=1e-5)


def test_new_parameterisations_start_as_the_plain_model():
    """Zero-initialised depth features change no logit; recency_init and block_init set their
    blocks; every block is the same draw of the same seed, scaled."""
    tokens, depths, _ = _keys()
    attempts = torch.tensor([[0, 0, 0, 0, 1]])
    args = (tokens, depths, attempts, torch.tensor([[4]]), torch.tensor([[2]]), torch.tensor([[1]]))
    plain = SearchTransformer(2, heads=2, init_scale=0.5, seed=3)
    for feats in ("relative", "sinusoidal"):
        other = SearchTransformer(2, heads=2, init_scale=0.5, seed=3, depth_features=feats)
        assert torch.equal(other(*args), plain(*args))
    m = SearchTransformer(2, heads=2, init_scale=0.5, seed=3, recency_init=2.0,
                          block_init={"u": 0.0})  # fmt: skip
    assert torch.equal(m.rho, torch.full((2,), 2.0)) and m.u.abs().sum() == 0
    assert torch.equal(m.values, plain.values)  # a block's scale does not change the draws
    with pytest.raises(ValueError, match="depth_features"):
        SearchTransformer(2, depth_features="absolute")


def test_block_learning_rates_and_stage_heads_keep_what_they_freeze(tmp_path):
    """A block at lr share 0 ends where it started; in a stage that trains head 0 only, head
    1's blocks do not move (Adam's momentum included), and the next stage moves them; each
    stage leaves its attention picture."""
    from tokenergy.runs import Run

    cfg = config_from_dict({
        "kind": "dfs", "model": {"init_scale": 0.5, "depth_features": "relative"},
        "train": {"depths": [1, 2, 2], "iterations": [8, 8, 8], "batch": 16,
                  "block_lr": {"u": 0.0}, "stage_heads": [[0], [1], [0, 1]]},
        "ablation": {"variants": {"two-heads": {}}},
    })  # fmt: skip
    start = SearchTransformer(2, 2, init_scale=0.5, seed=cfg.seed, depth_features="relative")
    snapshots = []
    import tokenergy.algos.dfs as dfs

    real = dfs.attention_picture

    def keep(model, k, depth, path, seed=0):
        snapshots.append({n: p.detach().clone() for n, p in model.named_parameters()})
        real(model, k, depth, path, seed)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dfs, "attention_picture", keep)
        run = Run(tmp_path / "run", cfg)
        model = train_dfs(cfg, run).model
    assert torch.equal(model.u, start.u)  # lr share 0
    first, second, third = snapshots
    for name in ("b", "rho", "values", "slope"):
        assert torch.equal(first[name][1], getattr(start, name)[1])  # stage 1: head 1 frozen
        if name != "slope":  # depth-1 trees: every key is at the decision's depth, no slope
            assert not torch.equal(first[name][0], getattr(start, name)[0])
        assert torch.equal(second[name][0], first[name][0])  # stage 2: head 0 frozen
        assert not torch.equal(second[name][1], first[name][1])
        assert not torch.equal(third[name][0], second[name][0])  # stage 3: both move
    assert not torch.equal(first["bias"], torch.zeros(2))  # the shared bias always trains
    for i in (1, 2, 3):
        assert (tmp_path / "run" / f"attention_stage{i}.png").is_file()
    from tokenergy.algos.dfs import load_search_model

    loaded = load_search_model(tmp_path / "run")
    assert loaded.depth_features == "relative" and torch.equal(loaded.slope, model.slope)


def test_parameterisation_config_errors():
    with pytest.raises(ConfigError, match=r"model\.depth_features"):
        config_from_dict({"kind": "dfs", "model": {"depth_features": "absolute"}})
    with pytest.raises(ConfigError, match=r"model\.block_init: unknown block 'rho'"):
        config_from_dict({"kind": "dfs", "model": {"block_init": {"rho": 1.0}}})
    with pytest.raises(ConfigError, match=r"train\.block_lr"):
        config_from_dict({"kind": "dfs", "train": {"block_lr": {"values": -0.1}}})
    with pytest.raises(ConfigError, match=r"train\.stage_heads: needs"):
        config_from_dict({"kind": "dfs", "train": {"stage_heads": [[0]]}})
    with pytest.raises(ConfigError, match=r"train\.stage_heads: head 2 of a 2-head"):
        config_from_dict({"kind": "dfs", "train": {"stage_heads": [[0], [2]]}})

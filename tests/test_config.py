"""Config validation: unknown keys with suggestions, wrong types, ranges, combinations."""

from pathlib import Path

import pytest

from tokenergy.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    parse_override_args,
    save_config,
)


def test_defaults_are_valid_and_round_trip(tmp_path):
    cfg = RunConfig()
    assert cfg.batch_size == 8 * 128
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg
    assert config_from_dict(config_to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    ("data", "field", "text"),
    [
        ({"ppo": {"clip_esp": 0.1}}, "ppo.clip_esp", "did you mean 'clip_eps'"),
        ({"enrgy": {}}, "enrgy", "did you mean 'energy'"),
        ({"ppo": {"epochs": "four"}}, "ppo.epochs", "must be int"),
        ({"ppo": {"epochs": 2.5}}, "ppo.epochs", "must be int"),
        ({"ppo": {"anneal_lr": 1}}, "ppo.anneal_lr", "must be bool"),
        ({"ppo": {"clip_eps": 1.5}}, "ppo.clip_eps", "must be in (0, 1)"),
        ({"ppo": {"gamma": -0.1}}, "ppo.gamma", "must be in [0, 1]"),
        ({"env": {"num_envs": 0}}, "env.num_envs", "must be in [1, 4096]"),
        ({"energy": {"weighting": "bottlenek"}}, "energy.weighting", "did you mean 'bottleneck'"),
        ({"energy": {"shuffle": True}}, "energy.shuffle", "set energy.weighting"),
        ({"ppo": {"minibatches": 3}}, "ppo.minibatches", "must divide the batch"),
        ({"ppo": {"total_steps": 10}}, "ppo.total_steps", "at least one batch"),
        ({"device": "tpu"}, "device", "cpu, cuda"),
        ({"model": {"hidden_sizes": [64, -1]}}, "model.hidden_sizes", "positive ints"),
        (
            {"ablation": {"variants": {"x": {"ppo.clip_eps": 7}}}},
            "ablation.variants.x.ppo.clip_eps",
            "must be in",
        ),
        ({"ppo": 3}, "ppo", "must be a mapping"),
    ],
)
def test_bad_values_name_the_field(data, field, text):
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert info.value.field_path == field
    assert text in str(info.value)


def test_overrides_dashes_types_and_sections():
    cfg = apply_overrides(
        RunConfig(), {"ppo.clip-eps": 0.1, "energy.shuffle": True, "energy.weighting": "bottleneck"}
    )
    assert cfg.ppo.clip_eps == 0.1 and cfg.energy.shuffle
    assert apply_overrides(cfg, {"ppo.lr": 1}).ppo.lr == 1.0  # ints are fine for floats
    # YAML reads 1e-4 (no dot) as a string; number fields take it as the number it spells
    cfg = apply_overrides(cfg, parse_override_args(["--ppo.lr", "1e-4", "--ppo.epochs", "1E1"]))
    assert cfg.ppo.lr == 1e-4 and cfg.ppo.epochs == 10 and isinstance(cfg.ppo.epochs, int)
    with pytest.raises(ConfigError, match="must be float, got '1e-4x'"):
        apply_overrides(cfg, {"ppo.lr": "1e-4x"})
    with pytest.raises(ConfigError, match="is a section"):
        apply_overrides(cfg, {"ppo": 1})
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides(cfg, {"seed.x": 1})
    with pytest.raises(ConfigError, match="did you mean 'seed'"):
        apply_overrides(cfg, {"sed": 1})


def test_overrides_reach_into_env_kwargs():
    from tokenergy.config import load_config

    cfg = load_config("configs/sokoban-ppo.yaml")
    cfg = apply_overrides(cfg, parse_override_args(["--env.kwargs.observation", "coords"]))
    assert cfg.env.kwargs["observation"] == "coords" and cfg.env.kwargs["size"] == 6  # kept
    with pytest.raises(ConfigError, match=r"^env.kwargs: sokoban: observation must be one of"):
        apply_overrides(cfg, {"env.kwargs.observation": "pixels"})
    with pytest.raises(ConfigError, match="unexpected keyword argument 'colour'"):
        apply_overrides(cfg, {"env.kwargs.colour": "red"})


def test_parse_override_args():
    args = [
        "--ppo.clip-eps",
        "0.1",
        "--energy.shuffle",
        "--model.hidden-sizes=[32, 32]",
        "--ppo.target-kl",
        "null",
    ]
    assert parse_override_args(args) == {
        "ppo.clip-eps": 0.1,
        "energy.shuffle": True,
        "model.hidden-sizes": [32, 32],
        "ppo.target-kl": None,
    }
    with pytest.raises(ConfigError, match="unexpected argument"):
        parse_override_args(["stray"])


def test_string_fields_stay_strings_from_the_cli(tmp_path):
    cfg = load_config(None, {"name": 123})
    assert cfg.name == "123"


def test_missing_or_broken_preset(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_shipped_presets_load():
    from pathlib import Path

    root = Path(__file__).parent.parent
    games = list((root / "runs" / "textworld-games").glob("*.z8"))
    for p in sorted(root.joinpath("configs").glob("*.yaml")):
        if "textworld" in p.name and not games:
            # its games are generated data (`make textworld`): without them, a clear error
            with pytest.raises(ConfigError, match=r"no \.z8 or \.ulx games .*make textworld"):
                load_config(p)
            continue
        load_config(p)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"energy.lam": 1.5}, r"energy.lam: must be in \[0, 1\], got 1.5"),
        ({"energy.lam_final": -0.1}, r"energy.lam_final: must be in \[0, 1\]"),
        ({"energy.tau": 0.0}, r"energy.tau: must be in \(0"),
        (
            {"energy.weighting": "actfokus"},
            r"energy.weighting: unknown token weighting 'actfokus'.*'actfocus'",
        ),
        ({"energy.source": "kl"}, r"energy.source: unknown token energy source 'kl'"),
        ({"energy.shuffle": True}, r"energy.shuffle: shuffling uniform weights"),
        (
            {"energy.source": "advantage", "energy.reward_beta": 0.1},
            r"energy.reward_beta: the advantage energy",
        ),
        ({"energy.top_rho": 0.0}, r"energy.top_rho: must be in \(0, 1\]"),
        ({"energy.alpha": 1.5}, r"energy.alpha: must be in \[0, 1\], got 1.5"),
        ({"energy.beta": -0.5}, r"energy.beta: must be in \[0, inf\], got -0.5"),
    ],
)
def test_lm_energy_config_errors_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(Path(__file__).parent.parent / "configs" / "sokoban-ppo.yaml", override)


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"kind": "vector", "ablation": {"variants": {"a/b": {}}}}, "ablation.variants.a/b"),
        ({"kind": "dfs", "ablation": {"variants": {"budget-1\\2": {}}}}, "ablation.variants"),
        ({"kind": "lm", "ablation": {"variants": {"x/y": {}}}}, "ablation.variants.x/y"),
        ({"kind": "lm", "ablation": {"envs": {"so/ko": {}}}}, "ablation.envs.so/ko"),
    ],
)
def test_ablation_names_that_would_nest_folders_are_refused(data, path):
    from tokenergy.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="names a run folder") as err:
        config_from_dict(data)
    assert str(err.value).startswith(path)

"""Typed run configuration: dataclasses validated at construction, YAML presets, CLI overrides.

A config is built from a YAML preset (data only) plus ``--section.field value`` overrides and
saved, resolved, in the run folder. Every field has a default and one line of help (the
``help`` metadata); every bad value raises :class:`ConfigError` naming the field and what is
allowed, before any work starts.

Each trainer's sections live in their own module (:mod:`.vector`, :mod:`.lm`,
:mod:`.pipeline`, :mod:`.dfs`) over the shared checks and sections of :mod:`.fields`;
:mod:`.build` turns dicts, presets and overrides into configs and back.
"""

from tokenergy.config.build import (
    CONFIG_KINDS,
    apply_overrides,
    config_class,
    config_from_dict,
    config_to_dict,
    load_config,
    parse_override_args,
    save_config,
)
from tokenergy.config.dfs import DFSRunConfig
from tokenergy.config.fields import AblationConfig, ConfigError, LogConfig
from tokenergy.config.lm import (
    AlgoConfig,
    EvalConfig,
    LMAblationConfig,
    LMModelConfig,
    LMRunConfig,
    RolloutConfig,
    SFTConfig,
    TextEnvConfig,
    TokenEnergyConfig,
)
from tokenergy.config.pipeline import PipelineRunConfig
from tokenergy.config.vector import EnergyConfig, EnvConfig, ModelConfig, PPOConfig, RunConfig

__all__ = [
    "CONFIG_KINDS",
    "AblationConfig",
    "AlgoConfig",
    "ConfigError",
    "DFSRunConfig",
    "EnergyConfig",
    "EnvConfig",
    "EvalConfig",
    "LMAblationConfig",
    "LMModelConfig",
    "LMRunConfig",
    "LogConfig",
    "ModelConfig",
    "PPOConfig",
    "PipelineRunConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "TextEnvConfig",
    "TokenEnergyConfig",
    "apply_overrides",
    "config_class",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "parse_override_args",
    "save_config",
]

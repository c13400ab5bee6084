"""Models. ``mlp`` holds the actor-critic for vector observations, ``lm`` the language-model
agents (tiny causal LMs, value head, save / load), ``tokenizer`` their word-level tokenizer."""

from tokenergy.models.lm import (
    MODEL_SIZES,
    AgentModel,
    ModelLoadError,
    build_agent,
    load_agent,
    save_agent,
)
from tokenergy.models.mlp import ActorCritic
from tokenergy.models.tokenizer import build_tokenizer

__all__ = [
    "MODEL_SIZES",
    "ActorCritic",
    "AgentModel",
    "ModelLoadError",
    "build_agent",
    "build_tokenizer",
    "load_agent",
    "save_agent",
]

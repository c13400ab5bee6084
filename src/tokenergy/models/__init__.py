"""Models. ``mlp`` holds the actor-critic for vector observations."""

from tokenergy.models.mlp import ActorCritic

__all__ = ["ActorCritic"]

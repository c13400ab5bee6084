"""The rollout stage: agents play text environments turn by turn (:mod:`.generate`), a batch
of episodes is padded into :class:`Trajectories` (:mod:`.batch`) and scored in one forward
pass per model (:mod:`.score`); :mod:`.episodes` plays a config's env for training data and
evaluation."""

from tokenergy.rollout.batch import Episode, Trajectories, collate
from tokenergy.rollout.generate import TurnGenerator, generate_turns, rollout, sample_next
from tokenergy.rollout.score import Scored, score, token_logprobs
from tokenergy.rollout.tokens import assign_roles, encode_observation, prompt_ids, tag_ids_of

__all__ = [
    "Episode",
    "Scored",
    "Trajectories",
    "TurnGenerator",
    "assign_roles",
    "collate",
    "encode_observation",
    "generate_turns",
    "prompt_ids",
    "rollout",
    "sample_next",
    "score",
    "tag_ids_of",
    "token_logprobs",
]

"""Token helpers of the rollout: an observation's ids, an episode's opening prompt, and the
:class:`~tokenergy.types.Role` of every token of an agent turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenergy.envs.text import TextEnv
from tokenergy.types import Role


def encode_observation(tokenizer, text: str) -> list[int]:
    """Observation text → ids, closed by a newline token so the agent knows its turn starts."""
    return tokenizer(text + "\n", add_special_tokens=False).input_ids


def prompt_ids(tokenizer, env: TextEnv, obs: str, instructions: bool) -> list[int]:
    """The episode's opening tokens: ``<bos>`` and the first observation, led by the env's
    one-line instructions when ``instructions`` is set."""
    if instructions:
        obs = f"{env.instructions} . answer as <think> … </think> <answer> move </answer>\n{obs}"
    return [tokenizer.bos_token_id, *encode_observation(tokenizer, obs)]


def assign_roles(ids: Sequence[int], tag_ids: dict[str, int]) -> list[int]:
    """Roles of the tokens of one agent turn, by reading its tags left to right.

    Tags, ``<eos>`` and ``<pad>`` are ``FORMAT``; tokens inside ``<answer>…</answer>`` are
    ``ACTION``; every other token the agent wrote (inside ``<think>`` or stray) is ``REASONING``.
    """
    roles, inside_answer = [], False
    fmt = {tag_ids[k] for k in ("<think>", "</think>", "<answer>", "</answer>", "eos", "pad")}
    for t in ids:
        if t in fmt:
            roles.append(int(Role.FORMAT))
            if t == tag_ids["<answer>"]:
                inside_answer = True
            elif t in (tag_ids["</answer>"], tag_ids["</think>"], tag_ids["<think>"]):
                inside_answer = False
        else:
            roles.append(int(Role.ACTION if inside_answer else Role.REASONING))
    return roles


def tag_ids_of(tokenizer) -> dict[str, int]:
    ids = {
        t: tokenizer.convert_tokens_to_ids(t)
        for t in ("<think>", "</think>", "<answer>", "</answer>")
    }
    ids["eos"] = tokenizer.eos_token_id
    ids["pad"] = tokenizer.pad_token_id
    return ids

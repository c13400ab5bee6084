"""verl plug-in: any ``tokenergy.envs`` text environment as a verl agent loop.

``tokenergy_text_env`` plays one episode of a text env turn by turn through verl's LLM server:
the prompt is the env's first observation; each turn the model writes until ``</answer>``
(a stop string of the sampling parameters), the env reads that text, and its next observation
joins the response with a mask of 0, so only what the model wrote is trained; the episode's
return is the trajectory's reward score. A dataset row names the episode in its
``extra_info``: ``{"env": "sokoban", "env_kwargs": {...}, "seed": 17, "max_turns": 5}``, and
selects the loop with ``agent_name: tokenergy_text_env`` (or
``actor_rollout_ref.rollout.agent.default_agent_loop=tokenergy_text_env``).

The episode logic, :func:`play_episode`, needs nothing of verl: it takes an async ``generate``
callable, so it is tested on CPU against our own rollout of the same env and seed. The agent
loop class is defined when verl is importable (``make verl`` builds ``.venv-verl``, since
verl 0.9.1 pins transformers below ours) and reaches Ray workers through the ``verl.plugins``
entry point of this package.

Not here yet: the paper's ActFocus as a verl policy loss. verl's policy loss sees per-token
weights only as ``rollout_is_weights``, and its reference worker returns the sampled token's
log-probability, not the logits' logsumexp that the paper's energy needs (docs/scaling.md).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from tokenergy.envs import make

__all__ = ["AGENT_NAME", "EpisodeTokens", "play_episode"]

AGENT_NAME = "tokenergy_text_env"
END_OF_TURN = "</answer>"

# generate(prompt_ids, sampling_params) -> (new token ids, their log-probs or None)
Generate = Callable[[list[int], dict[str, Any]], Awaitable[tuple[list[int], list[float] | None]]]


@dataclass
class EpisodeTokens:
    """One episode as verl trains it: the prompt, then the response (model turns with mask 1,
    the env's observations between them with mask 0), the return and the number of turns."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = None
    reward: float = 0.0
    turns: int = 0
    success: bool = False
    truncated: bool = False  # the response reached response_length before the episode ended


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


async def play_episode(
    generate: Generate,
    tokenizer,
    env_name: str,
    seed: int,
    sampling_params: dict[str, Any],
    *,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int = 5,
    response_length: int = 1024,
    prompt_prefix: list[int] | None = None,
) -> EpisodeTokens:
    """Play one episode of ``env_name`` (reset with ``seed``) with the model behind
    ``generate``. The prompt is ``prompt_prefix`` (default: the tokenizer's BOS, when it has
    one) and the first observation closed by a newline, as :func:`tokenergy.rollout.rollout`
    builds it; each later observation joins the response as ``observation + "\\n"`` with mask 0.
    The response stops at ``response_length`` tokens (``truncated``)."""
    env = make(env_name, **(env_kwargs or {}))
    obs, _ = env.reset(seed=seed)
    if prompt_prefix is None:
        bos = getattr(tokenizer, "bos_token_id", None)
        prompt_prefix = [] if bos is None else [bos]
    ep = EpisodeTokens(prompt_ids=[*prompt_prefix, *_encode(tokenizer, obs + "\n")])
    params = {**sampling_params, "stop": [END_OF_TURN], "include_stop_str_in_output": True}
    logprobs: list[float] = []
    info: dict[str, Any] = {}
    for _ in range(max_turns):
        room = response_length - len(ep.response_ids)
        if room <= 0:
            ep.truncated = True
            break
        ids, lps = await generate([*ep.prompt_ids, *ep.response_ids], params)
        ids = ids[:room]
        ep.response_ids += ids
        ep.response_mask += [1] * len(ids)
        logprobs += list(lps[: len(ids)]) if lps else [0.0] * len(ids)
        ep.turns += 1
        obs, reward, terminated, truncated, info = env.step(
            tokenizer.decode(ids, skip_special_tokens=False)
        )
        ep.reward += float(reward)
        if terminated or truncated:
            break
        obs_ids = _encode(tokenizer, obs + "\n")[: response_length - len(ep.response_ids)]
        ep.response_ids += obs_ids
        ep.response_mask += [0] * len(obs_ids)
    ep.success = bool(info.get("success", env.solved()))
    ep.response_logprobs = logprobs if any(logprobs) else None
    if ep.response_logprobs is not None:  # observation tokens carry 0.0, as verl pads them
        full = iter(logprobs)
        ep.response_logprobs = [next(full) if m else 0.0 for m in ep.response_mask]
    return ep


try:  # the agent loop exists where verl does (make verl)
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        register,
    )
except ImportError:
    AgentLoopBase = None


if AgentLoopBase is not None:

    @register(AGENT_NAME)
    class TokenergyTextEnvLoop(AgentLoopBase):
        """Plays the text env named by the row's ``extra_info`` (see the module docstring)."""

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
            info = dict(kwargs.get("extra_info") or {})
            t0 = time.perf_counter()

            async def generate(prompt_ids, params):
                out = await self.server_manager.generate(
                    request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=params
                )
                return out.token_ids, out.log_probs

            ep = await play_episode(
                generate,
                self.tokenizer,
                info["env"],
                int(info.get("seed", 0)),
                sampling_params,
                env_kwargs=info.get("env_kwargs") or {},
                max_turns=int(info.get("max_turns", 5)),
                response_length=int(self.rollout_config.response_length),
            )
            return AgentLoopOutput(
                prompt_ids=ep.prompt_ids,
                response_ids=ep.response_ids,
                response_mask=ep.response_mask,
                response_logprobs=ep.response_logprobs,
                reward_score=ep.reward,
                num_turns=2 * ep.turns,  # user and assistant messages, as verl counts them
                metrics=AgentLoopMetrics(generate_sequences=time.perf_counter() - t0),
                extra_fields={"success": ep.success, "truncated": ep.truncated},
            )

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

ActFocus (``../shared/papers/actfocus.md``) as a verl trainer: ``trainer.v1.trainer_mode=actfocus``
selects :class:`ActFocusTrainer`, verl's synchronous trainer with one step added after the
advantages: each response token's role is read from the ``<think>``/``<answer>`` spans of the
response ids (:func:`response_roles`, any tokenizer), its energy from the reference worker's
output, and the advantages are multiplied by the paper's weights rescaled to mean 1 over the
batch's trained tokens (:func:`actfocus_advantage_scale`). For weights ``w >= 0`` the clipped
loss of ``w * A`` is ``w`` times the clipped loss of ``A``, so verl's own policy loss with
``token-mean`` then computes the paper's ``sum(w * l) / sum(w)``, with the sums over the whole
batch of the iteration (our own trainer divides within each minibatch; the two differ only
when minibatches differ in their mean weight).
The energy is the paper's free energy of the frozen reference, ``-logsumexp_v f_ref[t, v]``,
from the reference pass verl runs anyway: the trainer asks the reference worker for its
"entropy" with a flag (:data:`FREE_ENERGY_FLAG`) under which verl's FSDP engine, patched when
this module is imported (every Ray worker imports it through the ``verl.plugins`` entry point),
computes ``-logsumexp`` of the logits in the entropy's place (:func:`free_energy_outputs`).
``+algorithm.actfocus.energy=ref_surprisal`` takes ``-log pi_ref(y_t)`` from the reference's
log-probs instead, with no patch involved.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import torch

from tokenergy.energy import actfocus_weights
from tokenergy.envs import make
from tokenergy.types import Role

__all__ = [
    "AGENT_NAME",
    "ENERGIES",
    "FREE_ENERGY_FLAG",
    "TRAINER_NAME",
    "EpisodeTokens",
    "actfocus_advantage_scale",
    "actfocus_energy",
    "actfocus_settings",
    "free_energy_outputs",
    "negative_logsumexp",
    "play_episode",
    "response_roles",
    "scale_batch_advantages",
    "turn_roles",
]

AGENT_NAME = "tokenergy_text_env"
TRAINER_NAME = "actfocus"
END_OF_TURN = "</answer>"
TAG = re.compile(r"</?(?:think|answer)>")
# the energies ActFocus can read in verl: the paper's (the default) and the reference surprisal
ENERGIES = ("ref_free_energy", "ref_surprisal")
# a micro-batch flag under which the patched FSDP engine returns -logsumexp as its "entropy"
FREE_ENERGY_FLAG = "tokenergy_free_energy"

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


def turn_roles(tokenizer, ids: Sequence[int]) -> list[int]:
    """The :class:`~tokenergy.types.Role` of each token of one model turn, for any tokenizer.

    The turn's text is the concatenation of its tokens' texts; a token that overlaps a tag
    (``<think>``, ``</think>``, ``<answer>``, ``</answer>``, however many tokens it takes) or
    is a special token is ``FORMAT``; a token after ``<answer>`` and before the next tag is
    ``ACTION``; every other token is ``REASONING``. With one token per tag this is
    :func:`tokenergy.rollout.tokens.assign_roles`."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    pieces = [tokenizer.decode([int(t)], skip_special_tokens=False) for t in ids]
    text = "".join(pieces)
    tags = [(m.start(), m.end(), m.group()) for m in TAG.finditer(text)]
    roles, start, k, inside_answer = [], 0, 0, False
    for t, piece in zip(ids, pieces, strict=True):
        end = start + len(piece)
        while k < len(tags) and tags[k][1] <= start:  # tags that closed before this token
            inside_answer = tags[k][2] == "<answer>"
            k += 1
        on_tag = k < len(tags) and tags[k][0] < end and start < tags[k][1]
        if on_tag or int(t) in special:
            roles.append(int(Role.FORMAT))
        else:
            roles.append(int(Role.ACTION if inside_answer else Role.REASONING))
        start = end
    return roles


def response_roles(
    tokenizer, response_ids: Sequence[int], response_mask: Sequence[int]
) -> list[int]:
    """Roles of a verl response: each run of mask-1 tokens is a model turn
    (:func:`turn_roles`), each run of mask-0 tokens an observation (``OBSERVATION``)."""
    roles: list[int] = []
    start = 0
    for i in range(1, len(response_ids) + 1):
        if i == len(response_ids) or bool(response_mask[i]) != bool(response_mask[start]):
            run = response_ids[start:i]
            if response_mask[start]:
                roles += turn_roles(tokenizer, run)
            else:
                roles += [int(Role.OBSERVATION)] * len(run)
            start = i
    return roles


def actfocus_advantage_scale(
    roles: torch.Tensor,
    energy: torch.Tensor,
    mask: torch.Tensor,
    alpha: float = 0.1,
    beta: float = 0.5,
    format_weight: float = 1.0,
) -> torch.Tensor:
    """The paper's ActFocus weights (:func:`tokenergy.energy.actfocus_weights`) rescaled to a
    mean of 1 over the trained tokens of the batch: ``w * sum(mask) / sum(mask * w)``, 0 off
    the mask (all 0 when every weight is). Multiplying the advantages by them turns a
    token-mean clipped loss into the paper's weight-normalised one."""
    mask = mask.bool()
    w = actfocus_weights(roles, energy, mask, alpha, beta, format_weight)
    total = (w * mask).sum()
    if total <= 0:
        return torch.zeros_like(w)
    return w * mask * (mask.sum() / total)


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


try:  # verl's v1 trainer needs its TransferQueue (requirements-verl.txt)
    import transfer_queue as tq
    from tensordict import TensorDict
    from verl.trainer.ppo.v1.trainer_base import register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.workers.utils.padding import response_from_nested, response_to_nested
except ImportError:
    PPOTrainerSync = None


def actfocus_settings(algorithm_config) -> dict[str, float]:
    """``alpha``, ``beta`` and ``format_weight`` from ``algorithm.actfocus`` of a verl config
    (``+algorithm.actfocus.alpha=0.1`` on verl's command line), the paper's values by default;
    a value out of range is a ``ValueError`` naming it. ``energy`` is read by
    :func:`actfocus_energy`."""
    given = dict((algorithm_config or {}).get("actfocus") or {})
    unknown = set(given) - {"alpha", "beta", "format_weight", "energy"}
    if unknown:
        raise ValueError(f"algorithm.actfocus: unknown field(s) {sorted(unknown)}")
    given.pop("energy", None)
    out = {"alpha": 0.1, "beta": 0.5, "format_weight": 1.0}
    out.update({k: float(v) for k, v in given.items()})
    if not 0.0 <= out["alpha"] <= 1.0:
        raise ValueError(f"algorithm.actfocus.alpha must lie in [0, 1], got {out['alpha']}")
    if out["beta"] < 0 or out["format_weight"] < 0:
        raise ValueError("algorithm.actfocus.beta and format_weight must be >= 0")
    return out


def actfocus_energy(algorithm_config) -> str:
    """``algorithm.actfocus.energy`` of a verl config, one of :data:`ENERGIES`; the paper's
    ``ref_free_energy`` by default."""
    energy = str(((algorithm_config or {}).get("actfocus") or {}).get("energy", ENERGIES[0]))
    if energy not in ENERGIES:
        raise ValueError(f"algorithm.actfocus.energy must be one of {ENERGIES}, got {energy!r}")
    return energy


def negative_logsumexp(logits: torch.Tensor, **_: Any) -> torch.Tensor:
    """``-logsumexp`` over the last (vocabulary) dimension, in float32: the free energy of the
    logits. Extra keywords (verl's ``chunk_size``) are ignored."""
    return -torch.logsumexp(logits.float(), dim=-1)


def free_energy_outputs(prepare_model_outputs: Callable) -> Callable:
    """verl's FSDP engine's ``prepare_model_outputs``, which for a micro-batch carrying
    :data:`FREE_ENERGY_FLAG` returns :func:`negative_logsumexp` of the (temperature-scaled)
    logits where it returns the entropy; every other micro-batch is untouched.

    The engine computes the entropy through its ``compute_entropy_from_logits`` (the packed path)
    or ``verl.utils.torch_functional.entropy_from_logits`` (the padded one); both are swapped for
    the call and put back after it. verl's fused kernels never hold the logits, so a flagged
    micro-batch with ``use_fused_kernels`` is a ``ValueError``.
    """
    import verl.utils.torch_functional as verl_F
    from verl.utils import tensordict_utils as tu

    @functools.wraps(prepare_model_outputs)
    def prepare(self, output, output_args, micro_batch, *args: Any, **kwargs: Any):
        if not tu.get_non_tensor_data(data=micro_batch, key=FREE_ENERGY_FLAG, default=False):
            return prepare_model_outputs(self, output, output_args, micro_batch, *args, **kwargs)
        if tu.get_non_tensor_data(data=micro_batch, key="use_fused_kernels", default=False):
            raise ValueError(
                "ActFocus's free energy reads the reference's logits, which verl's fused kernels "
                "never hold: turn use_fused_kernels off for the reference, or set "
                "+algorithm.actfocus.energy=ref_surprisal"
            )
        saved = self.compute_entropy_from_logits, verl_F.entropy_from_logits
        self.compute_entropy_from_logits = verl_F.entropy_from_logits = negative_logsumexp
        try:
            return prepare_model_outputs(self, output, output_args, micro_batch, *args, **kwargs)
        finally:
            self.compute_entropy_from_logits, verl_F.entropy_from_logits = saved

    prepare.tokenergy_free_energy = True
    return prepare


try:  # verl's FSDP engine, where the reference's logits exist
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
except ImportError:
    FSDPEngineWithLMHead = None
if FSDPEngineWithLMHead is not None and not getattr(
    FSDPEngineWithLMHead.prepare_model_outputs, "tokenergy_free_energy", False
):
    FSDPEngineWithLMHead.prepare_model_outputs = free_energy_outputs(
        FSDPEngineWithLMHead.prepare_model_outputs
    )


def scale_batch_advantages(
    tokenizer,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    energy: torch.Tensor,
    advantages: torch.Tensor,
    settings: dict[str, float],
) -> tuple[torch.Tensor, dict[str, float]]:
    """One verl batch (padded ``[B, R]`` tensors, right-padded with mask 0): the advantages
    times :func:`actfocus_advantage_scale` with the roles of the response ids and the given
    per-token energy, and the weights' means by role (metrics)."""
    mask = response_mask.bool()
    roles = torch.full(responses.shape, int(Role.OBSERVATION), dtype=torch.long)
    for i in range(responses.shape[0]):
        n = int(mask[i].nonzero().max()) + 1 if mask[i].any() else 0
        roles[i, :n] = torch.tensor(
            response_roles(tokenizer, responses[i, :n].tolist(), mask[i, :n].tolist())
        )
    scale = actfocus_advantage_scale(roles, energy.float(), mask, **settings)
    metrics = {}
    for role in (Role.REASONING, Role.ACTION, Role.FORMAT):
        on = mask & (roles == int(role))
        name = role.name.lower()
        metrics[f"actfocus/{name}_weight"] = float(scale[on].mean()) if on.any() else float("nan")
        metrics[f"actfocus/{name}_share"] = float(on.sum() / mask.sum().clamp(min=1))
    return advantages * scale.to(advantages.dtype), metrics


if PPOTrainerSync is not None:

    @register_trainer(TRAINER_NAME)
    class ActFocusTrainer(PPOTrainerSync):
        """verl's synchronous trainer whose advantages carry the paper's ActFocus weights
        (module docstring). Needs the reference: ``use_kl_loss=True`` with ``kl_loss_coef=0``
        runs it without a KL term, as the paper trains."""

        def _compute_ref_log_prob(self, batch, metrics: dict):
            """verl's reference step; with the paper's energy the reference's forward also
            returns its free energy (flagged as :data:`FREE_ENERGY_FLAG`, in the place of the
            entropy), stored as ``ref_free_energy`` over the response. The actor's entropy,
            which the reference's output overwrites, is put back."""
            if actfocus_energy(self.config.algorithm) != "ref_free_energy":
                return super()._compute_ref_log_prob(batch, metrics)
            keys, part = batch.keys, batch.partition_id
            kept = (tq.kv_batch_get(keys=keys, partition_id=part, select_fields=["entropy"])
                    if "entropy" in (batch.fields or []) else None)  # fmt: skip
            batch.extra_info.update({
                "calculate_entropy": True, FREE_ENERGY_FLAG: True, "compute_loss": False,
                "temperature": self.config.actor_rollout_ref.rollout.temperature,
            })  # fmt: skip
            try:
                if self.ref_in_actor:  # a LoRA policy: the reference is it without its adapter
                    batch.extra_info["no_lora_adapter"] = True
                    output = self.actor_rollout_wg.compute_log_prob(batch)
                else:
                    output = self.ref_policy_wg.compute_ref_log_prob(batch)
            finally:  # later steps must see neither flag
                batch.extra_info.pop(FREE_ENERGY_FLAG, None)
                batch.extra_info["calculate_entropy"] = False
            assert len(output) == len(batch)
            data = tq.kv_batch_get(keys=keys, partition_id=part,
                                   select_fields=["log_probs", "entropy", "response_mask"])  # fmt: skip
            mask = data["response_mask"]
            out = TensorDict(
                {"ref_log_prob": response_from_nested(data["log_probs"], mask),
                 "ref_free_energy": response_from_nested(data["entropy"], mask)},
                batch_size=len(batch),
            )  # fmt: skip
            if kept is not None:
                out["entropy"] = kept["entropy"]
            return tq.kv_batch_put(keys=keys, partition_id=part, fields=out)

        def _compute_advantage(self, batch, metrics: dict):
            batch = super()._compute_advantage(batch, metrics)
            source = actfocus_energy(self.config.algorithm)
            read = "ref_free_energy" if source == "ref_free_energy" else "ref_log_prob"
            fields = ["responses", "response_mask", read, "advantages"]
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=fields)  # fmt: skip
            if read not in set(data.keys()):
                raise ValueError(
                    "ActFocus reads the reference's forward: set "
                    "actor_rollout_ref.actor.use_kl_loss=True and kl_loss_coef=0"
                )
            nested_mask = data["response_mask"]
            padded = {k: data[k].to_padded_tensor(padding=0) for k in fields}
            energy = padded[read] if read == "ref_free_energy" else -padded[read]
            advantages, af_metrics = scale_batch_advantages(
                self.tokenizer, padded["responses"], padded["response_mask"], energy,
                padded["advantages"], actfocus_settings(self.config.algorithm),
            )  # fmt: skip
            metrics.update(af_metrics)
            out = TensorDict(
                {"advantages": response_to_nested(advantages, nested_mask)}, batch_size=len(batch)
            )
            return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)

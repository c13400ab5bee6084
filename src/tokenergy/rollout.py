"""Multi-turn rollouts of a language-model agent in text environments.

Each trajectory is one token sequence::

    <bos> obs_0 ⏎ <think> … </think> <answer> … </answer> obs_1 ⏎ <think> … obs_K ⏎

with a ``roles [B, T]`` tensor of :class:`~tokenergy.types.Role` (observation text is
``OBSERVATION`` and never trained), a loss mask over the tokens the agent wrote, and each turn's
reward on the last token of that turn. The final observation is kept so the value of the state
after the last turn can bootstrap a truncated episode.

Generation is batched over the active environments, one turn at a time, by a
:class:`TurnGenerator`: each episode's KV cache lives across its turns, so a turn feeds the
model only the new observation, then samples token by token until every sequence has closed
its ``</answer>`` (or written ``<eos>``, or hit the per-turn cap); finished episodes leave the
batch. Log-probs, values and
reference log-probs are *not* taken during sampling: :func:`score` recomputes them in one
full forward pass, so old and new log-probs come from the same computation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenergy.envs.text import TextEnv
from tokenergy.models.fast_decode import decoder_for
from tokenergy.models.lm import causal_only
from tokenergy.types import Role

__all__ = [
    "Episode",
    "Scored",
    "Trajectories",
    "TurnGenerator",
    "assign_roles",
    "collate",
    "encode_observation",
    "generate_turns",
    "rollout",
    "sample_next",
    "score",
    "token_logprobs",
]


@dataclass
class Episode:
    """One finished episode as token ids with roles and per-token rewards (no tensors yet)."""

    tokens: list[int] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    turn_texts: list[str] = field(default_factory=list)
    episode_return: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    turns: int = 0
    invalid_turns: int = 0
    seed: int = 0
    group: int = 0
    solver_moves: int = -1  # turns whose first move was the scripted solver's; -1: not counted
    state_turns: int = 0  # turns whose stated state was scored (perception)
    state_exact: int = 0  # of those, turns that stated the true state word for word
    state_tokens: float = 0.0  # summed share of state words right, position by position

    def extend(self, ids: Sequence[int], roles: Sequence[int]) -> None:
        self.tokens.extend(ids)
        self.roles.extend(roles)
        self.rewards.extend([0.0] * len(ids))


@dataclass
class Trajectories:
    """A right-padded batch of episodes. Position 0 is ``<bos>`` and is never trained.

    Fields are ``[B, T]`` unless noted.
    """

    tokens: torch.Tensor  # (B, T) int64
    roles: torch.Tensor  # (B, T) int64 Role values; padding is OBSERVATION
    attention_mask: torch.Tensor  # (B, T) bool: real tokens
    mask: torch.Tensor  # (B, T) bool: tokens the agent wrote (trained)
    rewards: torch.Tensor  # (B, T) float: each turn's reward on its last token
    terminated: torch.Tensor  # (B,) bool
    truncated: torch.Tensor  # (B,) bool
    last_index: torch.Tensor  # (B,) int64 index of the last real token
    episode_return: torch.Tensor  # (B,) float
    success: torch.Tensor  # (B,) bool
    turns: torch.Tensor  # (B,) int64
    invalid_turns: torch.Tensor  # (B,) int64
    groups: torch.Tensor  # (B,) int64: episodes from the same env seed share a group
    episodes: list[Episode]

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def to(self, device: torch.device | str) -> Trajectories:
        out = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            out[name] = v.to(device) if isinstance(v, torch.Tensor) else v
        return Trajectories(**out)

    def select(self, idx: torch.Tensor) -> Trajectories:
        """The sub-batch of rows ``idx`` (``[b]`` int64)."""
        out = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            if isinstance(v, torch.Tensor):
                out[name] = v[idx.to(v.device)]
            else:
                out[name] = [v[i] for i in idx.tolist()]
        return Trajectories(**out)


def collate(episodes: list[Episode], pad_id: int) -> Trajectories:
    """Right-pad a list of episodes into a :class:`Trajectories` batch."""
    B = len(episodes)
    T = max(len(e.tokens) for e in episodes)
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    roles = torch.full((B, T), int(Role.OBSERVATION), dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.bool)
    rewards = torch.zeros(B, T)
    for i, e in enumerate(episodes):
        n = len(e.tokens)
        tokens[i, :n] = torch.tensor(e.tokens)
        roles[i, :n] = torch.tensor(e.roles)
        attn[i, :n] = True
        rewards[i, :n] = torch.tensor(e.rewards)
    mask = attn & (roles != int(Role.OBSERVATION))
    mask[:, 0] = False

    def col(f: Callable[[Episode], Any], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([f(e) for e in episodes], dtype=dtype)

    return Trajectories(
        tokens=tokens,
        roles=roles,
        attention_mask=attn,
        mask=mask,
        rewards=rewards,
        terminated=col(lambda e: e.terminated, torch.bool),
        truncated=col(lambda e: e.truncated, torch.bool),
        last_index=col(lambda e: len(e.tokens) - 1, torch.long),
        episode_return=col(lambda e: e.episode_return, torch.float32),
        success=col(lambda e: e.success, torch.bool),
        turns=col(lambda e: e.turns, torch.long),
        invalid_turns=col(lambda e: e.invalid_turns, torch.long),
        groups=col(lambda e: e.group, torch.long),
        episodes=episodes,
    )


# --------------------------------------------------------------------------- token helpers


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


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> torch.Tensor:
    """Sample one token per row from ``[B, V]`` logits; ``temperature == 0`` is greedy.

    Top-p keeps the smallest set of tokens whose probability reaches ``top_p`` (the most
    likely token always stays).
    """
    if temperature == 0.0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)


def _grid_of(policy: torch.nn.Module):
    """The :class:`~tokenergy.models.grid.GridEmbedding` of a grid model, else ``None``."""
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    return getattr(getattr(base, "model", None), "grid", None)


class TurnGenerator:
    """Writes the next turn of a fixed set of episodes, keeping each one's KV cache between
    turns.

    Called with each row's whole context so far, it feeds the model only the tokens it has
    not seen (a turn's new observation, and the last token of the previous turn), then samples
    until every row has written a stop token (included) or ``max_new_tokens``. Rows are
    independent: a row's tokens do not depend on the others'. :meth:`keep` drops the rows
    whose episodes finished. Llama models run the lean engine
    (:class:`~tokenergy.models.fast_decode.LlamaDecoder`); other architectures prefill the
    whole left-padded context every turn through the Hugging Face forward.
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        stop_ids: set[int],
        pad_id: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        generator: torch.Generator | None,
    ) -> None:
        self.policy = policy
        self.stop = torch.tensor(sorted(stop_ids))
        self.pad_id = pad_id
        self.max_new_tokens = max_new_tokens
        self.temperature, self.top_p, self.generator = temperature, top_p, generator
        self.decoder = decoder_for(policy)  # Llama models: the lean engine, same logits
        self.started = False

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (indices into the last call's contexts, in order)."""
        if self.decoder is not None and self.started:
            self.decoder.keep(list(rows))

    @torch.no_grad()
    def __call__(self, contexts: list[list[int]]) -> list[list[int]]:
        """The new tokens of each row."""
        if self.decoder is None:
            return self._uncached(contexts)
        dec = self.decoder
        if not self.started:
            dec.start(len(contexts))
            self.started = True
        fed = dec.lengths.tolist()
        logits = dec.append([c[n:] for c, n in zip(contexts, fed, strict=True)])
        B = len(contexts)
        written = torch.zeros(B, self.max_new_tokens, dtype=torch.long)
        lengths = torch.zeros(B, dtype=torch.long)
        done = torch.zeros(B, dtype=torch.bool)
        for step in range(self.max_new_tokens):
            tok = sample_next(logits, self.temperature, self.top_p, self.generator).cpu()
            written[:, step] = tok
            live = ~done
            lengths += live.long()
            done |= torch.isin(tok, self.stop)
            if bool(done.all()) or step + 1 == self.max_new_tokens:
                break  # tokens not fed yet are the start of the next turn's chunk
            logits = dec.step(tok, live)
        return [row[:n].tolist() for row, n in zip(written, lengths.tolist(), strict=True)]

    def _uncached(self, contexts: list[list[int]]) -> list[list[int]]:
        """Prefill the whole left-padded context, then decode with the model's own cache."""
        policy = self.policy
        device = next(policy.parameters()).device
        B = len(contexts)
        L = max(len(c) for c in contexts)
        input_ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros(B, L, dtype=torch.long)
        for i, c in enumerate(contexts):
            input_ids[i, L - len(c) :] = torch.tensor(c)
            attn[i, L - len(c) :] = 1
        input_ids, attn = input_ids.to(device), attn.to(device)
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        grid = _grid_of(policy)  # a grid model: every new token's coordinates from all ids
        seen = (
            torch.cat([input_ids, input_ids.new_full((B, self.max_new_tokens), self.pad_id)], 1)
            if grid is not None
            else None
        )
        out = policy(
            input_ids=input_ids, attention_mask=attn, position_ids=position_ids, use_cache=True
        )
        cache, logits = out.cache, out.logits[:, -1]
        next_pos = position_ids[:, -1] + 1
        written = torch.zeros(B, self.max_new_tokens, dtype=torch.long)
        lengths = torch.zeros(B, dtype=torch.long)
        done = torch.zeros(B, dtype=torch.bool)
        one = torch.ones(B, 1, dtype=attn.dtype, device=device)
        for step in range(self.max_new_tokens):
            tok = sample_next(logits, self.temperature, self.top_p, self.generator).cpu()
            written[:, step] = tok
            lengths += (~done).long()
            done |= torch.isin(tok, self.stop)
            if bool(done.all()) or step + 1 == self.max_new_tokens:
                break
            extra = {}
            if seen is not None:
                seen[:, L + step] = tok.to(device)
                rows, cols = grid.coordinates(seen[:, : L + step + 1])
                extra = {"grid_coords": (rows[:, -1:], cols[:, -1:])}
            attn = torch.cat([attn, one], dim=1)
            out = policy(
                input_ids=tok[:, None].to(device),
                attention_mask=attn,
                position_ids=next_pos[:, None],
                cache=cache,
                use_cache=True,
                **extra,
            )
            cache, logits = out.cache, out.logits[:, -1]
            next_pos = next_pos + 1
        return [row[:n].tolist() for row, n in zip(written, lengths.tolist(), strict=True)]


@torch.no_grad()
def generate_turns(
    policy: torch.nn.Module,
    contexts: list[list[int]],
    stop_ids: set[int],
    pad_id: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
) -> list[list[int]]:
    """Continue each context until a stop token (included) or ``max_new_tokens``; the new
    tokens of each row (one :class:`TurnGenerator` turn from empty caches)."""
    gen = TurnGenerator(policy, stop_ids, pad_id, max_new_tokens, temperature, top_p, generator)
    return gen(contexts)


@torch.no_grad()
def rollout(
    policy: torch.nn.Module,
    tokenizer,
    envs: list[TextEnv],
    seeds: list[int],
    *,
    groups: list[int] | None = None,
    max_turns: int = 10,
    max_turn_tokens: int = 48,
    max_tokens: int = 1024,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    turn_fn: Callable[[TextEnv], str] | None = None,
    instructions: bool = False,
    count_solver_moves: bool = False,
    measure_perception: bool = False,
) -> list[Episode]:
    """Play one episode in each env (reset with ``seeds``), all turns batched over envs.

    Args:
        policy: a causal LM (the ``policy`` of an :class:`~tokenergy.models.AgentModel`).
        envs: one env per episode.
        seeds: reset seed of each env.
        groups: group id of each episode (GRPO); defaults to its index.
        max_turns: turns before the episode is truncated.
        max_turn_tokens: tokens the agent may write in one turn.
        max_tokens: total sequence length; an episode that would pass it is truncated.
        temperature, top_p: sampling; ``temperature = 0`` is greedy.
        generator: CPU generator for sampling.
        turn_fn: write each turn with this function of the env instead of the policy (the
            scripted solver, for SFT data); the text goes through the tokenizer.
        instructions: start the first observation with the env's one-line instructions (for
            pretrained models, which otherwise do not know the game).
        count_solver_moves: count in ``Episode.solver_moves`` the turns whose first move is
            the scripted solver's (a diagnostic; costs one solver call per turn).
        measure_perception: score the state each turn's scratchpad states against the
            env's true state (``Episode.state_*``; envs without a state description skip).

    Returns:
        One :class:`Episode` per env.
    """
    tag = tag_ids_of(tokenizer)
    stop_ids = {tag["</answer>"], tag["eos"]}
    episodes = [
        Episode(
            seed=s,
            group=(groups[i] if groups is not None else i),
            solver_moves=0 if count_solver_moves else -1,
        )
        for i, s in enumerate(seeds)
    ]
    for env, ep, seed in zip(envs, episodes, seeds, strict=True):
        obs, _ = env.reset(seed=seed)
        ids = prompt_ids(tokenizer, env, obs, instructions)
        ep.extend(ids, [int(Role.OBSERVATION)] * len(ids))
    active = list(range(len(envs)))
    writer = TurnGenerator(
        policy, stop_ids, tokenizer.pad_token_id, max_turn_tokens, temperature, top_p, generator
    )
    for _turn in range(max_turns):
        if not active:
            break
        if turn_fn is not None:
            turns = [
                tokenizer(turn_fn(envs[i]), add_special_tokens=False).input_ids for i in active
            ]
        else:
            turns = writer([episodes[i].tokens for i in active])
        still = []
        for i, ids in zip(active, turns, strict=True):
            ep, env = episodes[i], envs[i]
            text = tokenizer.decode(ids, skip_special_tokens=False)
            ep.extend(ids, assign_roles(ids, tag))
            ep.turn_texts.append(text)
            if count_solver_moves:
                ep.solver_moves += env.follows_solver(text)
            seen = env.perceive(text) if measure_perception else None
            if seen is not None:
                ep.state_turns += 1
                ep.state_exact += int(seen[0])
                ep.state_tokens += seen[1]
            obs, reward, terminated, truncated, info = env.step(text)
            ep.rewards[-1] += reward
            ep.episode_return += reward
            ep.turns += 1
            ep.invalid_turns += int(info.get("invalid", False))
            obs_ids = encode_observation(tokenizer, obs)
            ep.extend(obs_ids, [int(Role.OBSERVATION)] * len(obs_ids))
            over_budget = len(ep.tokens) + max_turn_tokens + len(obs_ids) > max_tokens
            if terminated or truncated or over_budget or ep.turns >= max_turns:
                ep.terminated = terminated
                ep.truncated = not terminated
                ep.success = bool(info.get("success", env.solved()))
            else:
                still.append(i)
        slot = {i: j for j, i in enumerate(active)}
        writer.keep([slot[i] for i in still])
        active = still
    return episodes


# --------------------------------------------------------------------------- scoring


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log-prob of each token under the logits of the position before it.

    Args:
        logits: ``[B, T, V]`` where ``logits[:, t]`` predicts token ``t + 1``.
        tokens: ``[B, T]``.

    Returns:
        ``[B, T]``; position 0 (nothing predicts it) is 0.
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    out = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return torch.cat([out.new_zeros(out.shape[0], 1), out], dim=1)


@dataclass
class Scored:
    """What the update needs besides the trajectories, computed without gradient.

    ``values[:, t]`` is the value of the state in which token ``t`` was chosen
    (``V(tokens[:t])``), aligned with ``logprobs[:, t]``.
    """

    logprobs: torch.Tensor  # (B, T)
    ref_logprobs: torch.Tensor  # (B, T); equals logprobs when there is no reference
    values: torch.Tensor  # (B, T)
    bootstrap: torch.Tensor  # (B,) value after the last real token (the final observation)
    entropy: torch.Tensor  # (B, T) policy entropy at each token's position
    free_energy: torch.Tensor | None = None  # (B, T) -logsumexp of the policy logits there
    kl_ref: torch.Tensor | None = None  # (B, T) exact KL(π_θ‖π_ref) there, with a reference
    ref_free_energy: torch.Tensor | None = None  # (B, T) -logsumexp of the reference's logits
    logits: torch.Tensor | None = None  # (B, T, V) shifted like logprobs, when kept


@torch.no_grad()
def score(
    agent: torch.nn.Module,
    ref: torch.nn.Module | None,
    traj: Trajectories,
    batch_size: int = 32,
    keep_logits: bool = False,
    extras: frozenset[str] = frozenset(),
    policy: bool = True,
) -> Scored:
    """One full forward pass (in chunks of ``batch_size`` rows) of the agent and the reference.

    Besides what the update needs it keeps the entropy and, when ``extras`` names them, the
    other per-token quantities energy sources read: ``free_energy``, ``ref_free_energy`` (the
    frozen reference's, the ActFocus paper's energy, from the reference pass that runs anyway)
    and ``kl_ref`` (the exact KL to the reference, a second softmax over the vocabulary), all
    shifted to the chosen token.

    With ``policy=False`` only the reference runs: the policy's log-probs, entropy and values
    stay zero for the caller to fill (a trainer whose one update reads the whole batch once
    takes them from that update's forward, where the ratio is 1).

    Rows are scored in order of length, each chunk cut to its longest row, so padding past a
    chunk's longest row is never computed; every row's numbers are its own (row order does not
    change them) and come back in the batch's order, zero past each row's end.
    """
    device = agent.device
    B, T = traj.tokens.shape
    out_names = ["logprobs", "ref", "values", "entropy", "free", "kl", "ref_free"]
    full = {k: torch.zeros(B, T) for k in out_names}
    boot = torch.zeros(B)
    logits_all = None
    order = torch.argsort(traj.last_index, descending=True, stable=True)

    def put(name: str, rows: torch.Tensor, x: torch.Tensor) -> None:
        # x (b, n) describes the predicting position; shift it to the chosen token
        full[name][rows, 1 : x.shape[1]] = x[:, :-1].float().cpu()

    for start in range(0, B, batch_size):
        rows = order[start : start + batch_size]
        n = int(traj.last_index[rows].max()) + 1
        tokens = traj.tokens[rows, :n].to(device)
        attn = traj.attention_mask[rows, :n].to(device)
        nxt = tokens[:, 1:, None]
        if policy:
            out = agent(tokens, attn)
            logits = out.logits.float()
            lse = torch.logsumexp(logits, -1)  # (b, n)
            logp = logits - lse[..., None]
            chosen = logp[:, :-1].gather(-1, nxt).squeeze(-1)  # (b, n - 1): token t + 1's
            full["logprobs"][rows, 1:n] = chosen.cpu()
            put("entropy", rows, -(logp.exp() * logp).sum(-1))
            if "free_energy" in extras:
                put("free", rows, -lse)
            put("values", rows, out.values.float())
            last = traj.last_index[rows].to(device)
            boot[rows] = out.values.float().gather(1, last[:, None]).squeeze(1).cpu()
            if keep_logits:
                if logits_all is None:
                    logits_all = torch.zeros(B, T, logits.shape[-1])
                logits_all[rows, 1:n] = logits[:, :-1].cpu()
        elif keep_logits or extras & {"free_energy", "kl_ref"}:
            raise ValueError("keep_logits, free_energy and kl_ref need the policy's pass")
        if ref is not None:
            ref_mask = causal_only(attn)
            ref_logits = ref(input_ids=tokens, attention_mask=ref_mask, use_cache=False).logits
            ref_logits = ref_logits.float()
            ref_lse = torch.logsumexp(ref_logits, -1)
            ref_chosen = ref_logits[:, :-1].gather(-1, nxt).squeeze(-1) - ref_lse[:, :-1]
            full["ref"][rows, 1:n] = ref_chosen.cpu()
            if "ref_free_energy" in extras:
                put("ref_free", rows, -ref_lse)
            if "kl_ref" in extras:
                ref_logp = ref_logits - ref_lse[..., None]
                put("kl", rows, (logp.exp() * (logp - ref_logp)).sum(-1))
    return Scored(
        logprobs=full["logprobs"],
        ref_logprobs=full["ref"] if ref is not None else full["logprobs"].clone(),
        values=full["values"],
        bootstrap=boot,
        entropy=full["entropy"],
        free_energy=full["free"] if "free_energy" in extras else None,
        kl_ref=full["kl"] if ref is not None and "kl_ref" in extras else None,
        ref_free_energy=full["ref_free"]
        if ref is not None and "ref_free_energy" in extras
        else None,
        logits=logits_all,
    )

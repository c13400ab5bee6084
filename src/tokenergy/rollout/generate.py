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

import torch

from tokenergy.envs.text import TextEnv
from tokenergy.models.fast_decode import decoder_for
from tokenergy.rollout.batch import Episode
from tokenergy.rollout.tokens import assign_roles, encode_observation, prompt_ids, tag_ids_of
from tokenergy.types import Role


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

"""A lean decode engine for Llama-family causal LMs: the same modules, a KV cache kept per row.

Generating a turn calls the model once per token. For the small models of this project the
arithmetic of a call is tiny and the time goes to the framework around it (mask building,
cache objects, output wrappers, concatenation) and to recomputing what an earlier call knew.
:class:`LlamaDecoder` runs the model's own submodules (embedding, RMS norms, the q/k/v/o
projections, rotary embedding, MLPs, LM head — LoRA adapters included, since the wrapped
modules are called) over a preallocated key/value cache in which every row has its own length:

- row ``i`` holds its tokens at slots ``0 … n_i - 1``; a token's slot is its position, so there
  is no padding inside the cache and attention reads the filled part only (``max n_i`` slots);
- :meth:`~LlamaDecoder.append` adds a different number of tokens to each row (a turn's new
  observation) and returns the logits after each row's last one; :meth:`~LlamaDecoder.step`
  adds one token to every row, advancing only the rows still writing;
- :meth:`~LlamaDecoder.keep` drops finished rows (the batch is compacted), so an episode's cache
  lives across its turns and only what is new is ever computed;
- the cache grows in blocks as rows get longer, so its memory follows the longest row;
- a grid model's row / column coordinates are carried along token by token
  (:class:`GridState`), the same rule :func:`~tokenergy.models.grid.grid_coordinates` applies
  to whole sequences.

Logits match the Hugging Face forward to float precision (``tests/test_fast_decode.py``).
Other architectures fall back to the plain forward (:func:`decoder_for` returns ``None``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

__all__ = ["GridState", "LlamaDecoder", "decoder_for"]

_GROW = 128  # cache slots are added in blocks of this many


def _base_model(policy: torch.nn.Module) -> torch.nn.Module:
    get = getattr(policy, "get_base_model", None)  # a peft wrapper
    return get() if callable(get) else policy


def decoder_for(policy: torch.nn.Module) -> LlamaDecoder | None:
    """A :class:`LlamaDecoder` for ``policy`` when it is a Llama causal LM, else ``None``.

    ``TOKENERGY_FAST_DECODE=0`` in the environment turns the fast path off.
    """
    if os.environ.get("TOKENERGY_FAST_DECODE", "1") == "0":
        return None
    base = _base_model(policy)
    if type(base).__name__ not in ("LlamaForCausalLM", "GridLlamaForCausalLM") or base.training:
        return None
    return LlamaDecoder(base)


@dataclass
class GridState:
    """Per-row state of the grid-coordinate rule after the tokens read so far (all ``(B,)``).

    ``opens``: the last token opened an observation segment (true before the first token);
    ``agent``: the segment has seen the agent's ``<think>`` / ``<answer>``; ``newlines``:
    newlines in the segment; ``col``: the last token's column counter; ``after_newline``: the
    last token was a newline.
    """

    opens: torch.Tensor
    agent: torch.Tensor
    newlines: torch.Tensor
    col: torch.Tensor
    after_newline: torch.Tensor

    @classmethod
    def start(cls, batch: int, device: torch.device) -> GridState:
        false = torch.zeros(batch, dtype=torch.bool, device=device)
        zero = torch.zeros(batch, dtype=torch.long, device=device)
        return cls(false | True, false, zero, zero.clone(), false.clone())

    def select(self, rows: torch.Tensor) -> GridState:
        return GridState(*(getattr(self, f.name)[rows] for f in fields(self)))

    def where(self, keep_new: torch.Tensor, new: GridState) -> GridState:
        """``new`` on the rows of ``keep_new``, this state elsewhere."""
        return GridState(
            *(
                torch.where(keep_new, getattr(new, f.name), getattr(self, f.name))
                for f in fields(self)
            )
        )


class _GridRule:
    """The coordinates of one more token per row, from :class:`GridState` (the rule of
    :mod:`tokenergy.models.grid`, read left to right)."""

    def __init__(self, config, device: torch.device) -> None:
        def ids(xs) -> torch.Tensor:
            return torch.tensor(list(xs or []), dtype=torch.long, device=device)

        self.newline = config.grid_newline_id
        self.open_ids = ids(config.grid_open_ids)
        self.agent_ids = ids(config.grid_agent_ids)
        self.skip_ids = ids(config.grid_skip_ids)
        self.max_row, self.max_col = config.grid_rows, config.grid_cols

    def __call__(
        self, s: GridState, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, GridState]:
        starts = s.opens
        agent = (s.agent & ~starts) | torch.isin(x, self.agent_ids)
        newlines = torch.where(starts, 0, s.newlines)
        newline = x == self.newline
        col = torch.where(starts | s.after_newline, 1, s.col + 1)
        grid = ~agent & ~newline & ~torch.isin(x, self.skip_ids)
        rows = torch.where(grid, (newlines + 1).clamp(max=self.max_row), 0)
        cols = torch.where(grid, col.clamp(max=self.max_col), 0)
        new = GridState(torch.isin(x, self.open_ids), agent, newlines + newline, col, newline)
        return rows, cols, new


class LlamaDecoder:
    """A batch of rows, each a token sequence with its own key/value cache.

    Args:
        model: a ``LlamaForCausalLM`` or ``GridLlamaForCausalLM`` (or a peft model around
            one: its LoRA-wrapped projections are what gets called), in eval mode.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self.rope = apply_rotary_pos_emb
        model = _base_model(model)
        self.model = model
        inner = model.model
        self.embed = inner.embed_tokens
        self.grid = getattr(inner, "grid", None)  # a GridLlamaModel's row / column embeddings
        self.layers = list(inner.layers)
        self.norm = inner.norm
        self.rotary = inner.rotary_emb
        self.lm_head = model.lm_head
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.device = next(model.parameters()).device
        self.dtype = self.embed.weight.dtype
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths = torch.zeros(0, dtype=torch.long, device=self.device)  # (B,) n_i
        self.cos = self.sin = None  # rotary tables over positions 0 … capacity - 1
        self.grid_rule = _GridRule(cfg, self.device) if self.grid is not None else None
        self.grid_state: GridState | None = None

    # ---------------------------------------------------------------- cache bookkeeping

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def start(self, batch: int) -> None:
        """Empty rows: ``batch`` of them, each of length 0."""
        self.keys, self.values = [], []
        self.lengths = torch.zeros(batch, dtype=torch.long, device=self.device)
        if self.grid_rule is not None:
            self.grid_state = GridState.start(batch, self.device)
        self._reserve(_GROW)

    def _reserve(self, slots: int) -> None:
        """Make room for ``slots`` positions in every row (the cache grows in blocks)."""
        if slots <= self.capacity:
            return
        cap = -(-slots // _GROW) * _GROW
        shape = (self.batch, self.n_kv, cap, self.head_dim)
        old = self.capacity
        for store in (self.keys, self.values):
            for i in range(len(self.layers)):
                grown = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if old:
                    grown[:, :, :old] = store[i]
                if len(store) > i:
                    store[i] = grown
                else:
                    store.append(grown)
        positions = torch.arange(cap, device=self.device)[None]
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        cos, sin = self.rotary(probe, positions)
        self.cos, self.sin = cos[0], sin[0]  # (cap, head_dim)

    def keep(self, rows: Sequence[int] | torch.Tensor) -> None:
        """Keep only ``rows`` (in that order): finished rows leave the batch."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        self.keys = [k.index_select(0, idx) for k in self.keys]
        self.values = [v.index_select(0, idx) for v in self.values]
        self.lengths = self.lengths.index_select(0, idx)
        if self.grid_state is not None:
            self.grid_state = self.grid_state.select(idx)

    # ---------------------------------------------------------------- forward passes

    @torch.no_grad()
    def append(self, chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        """Add ``chunks[i]`` (at least one token) to row ``i``; the logits after each row's
        last new token, ``(B, V)``."""
        if len(chunks) != self.batch:
            raise ValueError(f"{len(chunks)} chunks for a batch of {self.batch} rows")
        sizes = torch.tensor([len(c) for c in chunks], dtype=torch.long, device=self.device)
        if bool((sizes == 0).any()):
            raise ValueError("every row needs at least one new token")
        t = int(sizes.max())
        ids = torch.zeros(self.batch, t, dtype=torch.long)
        for i, c in enumerate(chunks):
            ids[i, : len(c)] = torch.as_tensor(c, dtype=torch.long)
        ids = ids.to(self.device)
        real = torch.arange(t, device=self.device)[None] < sizes[:, None]  # (B, t)
        coords = None
        if self.grid_rule is not None:
            rows, cols = [], []
            for j in range(t):
                r, c, new = self.grid_rule(self.grid_state, ids[:, j])
                self.grid_state = self.grid_state.where(real[:, j], new)
                rows.append(r)
                cols.append(c)
            coords = (torch.stack(rows, 1), torch.stack(cols, 1))
        h = self._run(ids, coords)
        last = h[torch.arange(self.batch, device=self.device), sizes - 1]  # (B, H)
        self.lengths = self.lengths + sizes
        return self.lm_head(self.norm(last))

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, advance: torch.Tensor) -> torch.Tensor:
        """Add one token per row; rows where ``advance`` is false compute it but keep their
        length (it is overwritten later). The next logits of every row, ``(B, V)``."""
        tokens = tokens.to(self.device)
        advance = advance.to(self.device)
        coords = None
        if self.grid_rule is not None:
            r, c, new = self.grid_rule(self.grid_state, tokens)
            self.grid_state = self.grid_state.where(advance, new)
            coords = (r[:, None], c[:, None])
        h = self._run(tokens[:, None], coords)
        self.lengths = self.lengths + advance.long()
        return self.lm_head(self.norm(h[:, 0]))

    def _run(
        self, ids: torch.Tensor, coords: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        """The last hidden states of ``ids`` ``(B, t)`` written at slots ``n_i …``."""
        B, t = ids.shape
        self._reserve(int(self.lengths.max()) + t)
        h = self.embed(ids)
        if coords is not None:
            h = h + self.grid(*coords)
        slots = self.lengths[:, None] + torch.arange(t, device=self.device)[None]  # (B, t)
        span = int(slots.max()) + 1  # attention reads slots 0 … span - 1
        allowed = torch.arange(span, device=self.device)[None, None] <= slots[:, :, None]
        mask = allowed[:, None]  # (B, 1, t, span): causal within the row, nothing past it
        cos, sin = self.cos[slots], self.sin[slots]  # (B, t, head_dim)
        rows = torch.arange(B, device=self.device)[:, None]
        rep = self.n_heads // self.n_kv
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(B, t, -1, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(B, t, -1, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(B, t, -1, self.head_dim).transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            self.keys[i][rows, :, slots] = k.transpose(1, 2)
            self.values[i][rows, :, slots] = v.transpose(1, 2)
            keys, values = self.keys[i][:, :, :span], self.values[i][:, :, :span]
            if rep > 1:
                keys = keys.repeat_interleave(rep, dim=1)
                values = values.repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(B, t, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h

"""Row and column embeddings for the grid tokens of text observations.

With rotary positions a token's position reaches attention only through the query-key
product, never through the values, so to say *where* the ``P`` of a Sokoban room is a model
must count newlines and cells. Adding a learned embedding of each observation token's row and
column to its token embedding puts the coordinates into the value that attention copies (as
2-D position embeddings do in vision transformers). Measured on the ``tiny`` Sokoban agent
after 4096 demonstrations (docs/results/perception.md, one seed): the room stated exactly on
0.951 of the turns with them, 0.937 without, success 0.707 against 0.607; on FrozenLake's
coordinates observation, which spells positions out, they do not help.

Coordinates are a causal function of the token ids alone, so the model computes them itself
in every forward pass (SFT, scoring, the update, a critic) and a decoder step needs only the
ids so far:

- an observation segment starts after ``<bos>`` and after ``</answer>``, and ends at the
  first ``<think>`` or ``<answer>`` the agent writes;
- inside it, a token's row is 1 + the newlines (``⏎``) before it in the segment, its column 1 +
  the tokens since that newline (or the segment start); rows and columns past the table are
  clamped to its last entry;
- every other token (the agent's own, tags, special tokens, the newlines) gets coordinate 0,
  whose embedding is zero and stays zero.

A turn the agent ends without ``</answer>`` (the per-turn token cap) does not open a segment,
so the next observation goes without coordinates; the scripted turns of SFT always close.
:class:`GridLlamaForCausalLM` is a ``LlamaForCausalLM`` with these embeddings, registered with
the ``Auto`` classes so that ``from_pretrained`` loads it from a saved folder.
"""

from __future__ import annotations

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaForCausalLM, LlamaModel

__all__ = [
    "GridEmbedding",
    "GridLlamaConfig",
    "GridLlamaForCausalLM",
    "GridLlamaModel",
    "grid_coordinates",
    "grid_token_ids",
]


def grid_token_ids(tokenizer) -> dict[str, object]:
    """The config fields of :class:`GridLlamaConfig` that name token ids, from a tokenizer."""
    from tokenergy.models.tokenizer import NEWLINE, TAG_TOKENS

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in TAG_TOKENS}
    specials = [tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id]
    return {
        "grid_newline_id": tokenizer.convert_tokens_to_ids(NEWLINE),
        "grid_open_ids": [tokenizer.bos_token_id, ids["</answer>"]],
        "grid_agent_ids": [ids["<think>"], ids["<answer>"]],
        "grid_skip_ids": sorted({*specials, *ids.values()}),
    }


def _segment_cumsum(x: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Inclusive cumulative sum of ``x`` (B, T) restarted at every ``starts`` position."""
    total = x.cumsum(1)
    offset = torch.where(starts, total - x, torch.zeros_like(total)).cummax(1).values
    return total - offset


def grid_coordinates(
    input_ids: torch.Tensor,
    newline_id: int,
    open_ids: list[int],
    agent_ids: list[int],
    skip_ids: list[int],
    max_row: int,
    max_col: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's (row, column) inside its observation, 0 outside (the rules above).

    Args:
        input_ids: ``[B, T]`` token ids of whole sequences from their start (left padding
            before ``<bos>`` gets meaningless coordinates; it is masked anyway).
        newline_id: the newline token.
        open_ids: tokens after which an observation starts (``<bos>``, ``</answer>``).
        agent_ids: tokens that end an observation (``<think>``, ``<answer>``).
        skip_ids: tokens that never get coordinates (tags, special tokens).
        max_row, max_col: the last row and column of the tables; larger ones are clamped.

    Returns:
        ``(rows, cols)``, both ``[B, T]`` int64.
    """
    B, T = input_ids.shape
    device = input_ids.device
    opens = torch.isin(input_ids, torch.tensor(open_ids, device=device))
    starts = torch.zeros(B, T, dtype=torch.bool, device=device)
    starts[:, 0] = True
    starts[:, 1:] = opens[:, :-1]
    agent = torch.isin(input_ids, torch.tensor(agent_ids, device=device)).long()
    in_obs = _segment_cumsum(agent, starts) == 0
    newline = input_ids == newline_id
    rows = _segment_cumsum(newline.long(), starts) - newline.long() + 1
    index = torch.arange(T, device=device).expand(B, T)
    row_start = starts.clone()
    row_start[:, 1:] |= newline[:, :-1]
    cols = index - torch.where(row_start, index, torch.zeros_like(index)).cummax(1).values + 1
    grid = in_obs & ~newline & ~torch.isin(input_ids, torch.tensor(skip_ids, device=device))
    rows = torch.where(grid, rows.clamp(max=max_row), torch.zeros_like(rows))
    cols = torch.where(grid, cols.clamp(max=max_col), torch.zeros_like(cols))
    return rows, cols


@strict
class GridLlamaConfig(LlamaConfig):
    """A ``LlamaConfig`` with the sizes of the row / column tables and the token ids that
    :func:`grid_coordinates` reads."""

    model_type = "tokenergy_grid_llama"

    grid_rows: int = 16
    grid_cols: int = 48
    grid_newline_id: int = -1
    grid_open_ids: list[int] | None = None
    grid_agent_ids: list[int] | None = None
    grid_skip_ids: list[int] | None = None


class GridEmbedding(nn.Module):
    """``row_embed[row] + col_embed[col]`` of every token; index 0 (not a grid token) is a
    zero row that never trains (``padding_idx``)."""

    def __init__(self, config: GridLlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.row_embed = nn.Embedding(config.grid_rows + 1, config.hidden_size, padding_idx=0)
        self.col_embed = nn.Embedding(config.grid_cols + 1, config.hidden_size, padding_idx=0)

    def coordinates(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`grid_coordinates` with this model's token ids and table sizes."""
        c = self.config
        return grid_coordinates(
            input_ids,
            c.grid_newline_id,
            list(c.grid_open_ids or []),
            list(c.grid_agent_ids or []),
            list(c.grid_skip_ids or []),
            c.grid_rows,
            c.grid_cols,
        )

    def forward(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:  # (B, T, H)
        return self.row_embed(rows) + self.col_embed(cols)


class GridLlamaModel(LlamaModel):
    """``LlamaModel`` whose input embedding adds each token's row and column embedding.

    Called with ``input_ids`` of whole sequences it computes the coordinates itself; a caller
    that feeds a suffix (a decoder with a cache) passes ``grid_coords=(rows, cols)`` of it.
    """

    config_class = GridLlamaConfig

    def __init__(self, config: GridLlamaConfig) -> None:
        super().__init__(config)
        self.grid = GridEmbedding(config)
        self.post_init()

    def embed(
        self,
        input_ids: torch.Tensor,
        grid_coords: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        rows, cols = grid_coords if grid_coords is not None else self.grid.coordinates(input_ids)
        return self.embed_tokens(input_ids) + self.grid(rows, cols)

    def forward(self, input_ids=None, inputs_embeds=None, grid_coords=None, **kwargs):
        if inputs_embeds is None and input_ids is not None:
            cache = kwargs.get("cache")
            if grid_coords is None and cache is not None and cache.get_seq_length() > 0:
                raise ValueError("a grid model fed a suffix after a cache needs grid_coords")
            inputs_embeds, input_ids = self.embed(input_ids, grid_coords), None
        return super().forward(input_ids=input_ids, inputs_embeds=inputs_embeds, **kwargs)


class GridLlamaForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM`` over a :class:`GridLlamaModel`."""

    config_class = GridLlamaConfig

    def __init__(self, config: GridLlamaConfig) -> None:
        super().__init__(config)
        self.model = GridLlamaModel(config)
        self.post_init()


AutoConfig.register(GridLlamaConfig.model_type, GridLlamaConfig, exist_ok=True)
AutoModel.register(GridLlamaConfig, GridLlamaModel, exist_ok=True)
AutoModelForCausalLM.register(GridLlamaConfig, GridLlamaForCausalLM, exist_ok=True)

"""The word-level tokenizer of the local agents: special and tag tokens, and every word the
registered text envs use, so any env text tokenizes without ``<unk>``."""

from __future__ import annotations

__all__ = ["NEWLINE", "SPECIAL_TOKENS", "TAG_TOKENS", "build_tokenizer"]

NEWLINE = "⏎"  # newlines are a token of their own: grids are read row by row
SPECIAL_TOKENS = {
    "pad_token": "<pad>",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "unk_token": "<unk>",
}
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]


def build_tokenizer(extra_words: list[str] | None = None):
    """A word-level ``PreTrainedTokenizerFast`` over the text envs' vocabulary.

    Words are split on whitespace and commas; tags (``<think>`` …) are matched anywhere, so
    ``<answer>Up</answer>`` is three tokens. Newlines become the token ``⏎``. The vocabulary
    is sorted, so the same envs always give the same ids.

    Args:
        extra_words: more words to include (e.g. a custom env's vocabulary).
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tokenergy.envs import TEXT_ENVS

    words: set[str] = {NEWLINE, ".", ":", "||", *(str(d) for d in range(10))}
    for name in TEXT_ENVS:
        try:
            env = TEXT_ENVS.get(name)()
        except ValueError:
            continue  # an env that needs arguments (textworld: its games) has an open vocabulary
        words.update(env.vocabulary())
        words.update(f"{env.instructions} . answer as … move".split())
    words.update(extra_words or [])
    specials = [*SPECIAL_TOKENS.values(), *TAG_TOKENS]
    vocab = {tok: i for i, tok in enumerate([*specials, *sorted(words - set(specials))])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace("\n", f" {NEWLINE} ")
    # commas are words of their own, so Sudoku's "2,3,4" is five known tokens
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(",", behavior="isolated")]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)
    fast.add_special_tokens({"additional_special_tokens": TAG_TOKENS})
    return fast

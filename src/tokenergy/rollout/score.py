"""Scoring a batch in one forward pass per model: the chosen tokens' log-probs, entropies,
values, the reference's log-probs and free energies (:func:`score`, :class:`Scored`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenergy.models.lm import causal_only
from tokenergy.rollout.batch import Trajectories


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
    ref_entropy: torch.Tensor | None = None  # (B, T) the reference's entropy there
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
    frozen reference's, the ActFocus paper's energy, from the reference pass that runs anyway),
    ``ref_entropy`` (the reference's entropy, from the same pass) and ``kl_ref`` (the exact KL
    to the reference, a second softmax over the vocabulary), all shifted to the chosen token.

    With ``policy=False`` only the reference runs: the policy's log-probs, entropy and values
    stay zero for the caller to fill (a trainer whose one update reads the whole batch once
    takes them from that update's forward, where the ratio is 1).

    Rows are scored in order of length, each chunk cut to its longest row, so padding past a
    chunk's longest row is never computed; every row's numbers are its own (row order does not
    change them) and come back in the batch's order, zero past each row's end.
    """
    device = agent.device
    B, T = traj.tokens.shape
    out_names = ["logprobs", "ref", "values", "entropy", "free", "kl", "ref_free", "ref_ent"]
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
            if extras & {"kl_ref", "ref_entropy"}:
                ref_logp = ref_logits - ref_lse[..., None]
            if "kl_ref" in extras:
                put("kl", rows, (logp.exp() * (logp - ref_logp)).sum(-1))
            if "ref_entropy" in extras:
                put("ref_ent", rows, -(ref_logp.exp() * ref_logp).sum(-1))
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
        ref_entropy=full["ref_ent"] if ref is not None and "ref_entropy" in extras else None,
        logits=logits_all,
    )

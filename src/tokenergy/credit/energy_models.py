"""Learned energy sources: small models trained online beside the policy.

- :class:`Discriminator` tells solver tokens from agent tokens; ``E = -log D`` is high where
  the agent writes what the scripted solver would not (seed 001's discriminator energy).
- :class:`UncertaintyEnsemble` is a few heads predicting the environment's next observation
  token; their disagreement is high where the outcome of what the agent wrote is novel
  (curiosity by ensemble disagreement, Pathak et al., 2019, arXiv:1906.04161).
- :class:`NextObservationModel` is one such head; its prediction error on the environment's
  reply to a turn is that turn's curiosity bonus (``rollout.curiosity_coef``; Pathak et al.,
  2017, arXiv:1705.05363, with a token model in place of a feature model).

Both read a causal window of the ``window`` most recent token ids (the token itself
included), never the policy's activations, so they cost a few small matrix products per
iteration and their gradients can never reach the policy. ``update`` trains them on a batch;
``energy`` scores one, without gradient.
"""

from __future__ import annotations

import torch
from torch import nn

from tokenergy.types import Role

__all__ = ["Discriminator", "NextObservationModel", "UncertaintyEnsemble", "window_ids"]


def window_ids(tokens: torch.Tensor, window: int, pad_id: int) -> torch.Tensor:
    """``[B, T] -> [B, T, window]``: at ``t`` the ids ``tokens[t-window+1 : t+1]``, padded."""
    b, _ = tokens.shape
    padded = torch.cat([tokens.new_full((b, window - 1), pad_id), tokens], 1)
    return padded.unfold(1, window, 1)


class _WindowNet(nn.Module):
    def __init__(self, vocab_size: int, out_dim: int, window: int, dim: int, hidden: int):
        super().__init__()
        self.window = window
        self.embed = nn.Embedding(vocab_size + 1, dim)  # the last id pads the window's start
        self.mlp = nn.Sequential(
            nn.Linear(window * dim, hidden), nn.Tanh(), nn.Linear(hidden, out_dim)
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = window_ids(ids, self.window, self.embed.num_embeddings - 1)
        return self.mlp(self.embed(x).flatten(-2))


class Discriminator:
    """A window classifier: ``D(x_t)`` = P(token ``t`` was written by the scripted solver).

    Args:
        vocab_size: the tokenizer's size.
        window: tokens of context read at each position.
        lr: Adam learning rate.
        steps: gradient steps per :meth:`update`.
        seed: initialisation seed.
    """

    def __init__(
        self, vocab_size: int, window: int = 4, lr: float = 3e-3, steps: int = 20, seed: int = 0
    ) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = _WindowNet(vocab_size, 1, window, dim=16, hidden=32)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.steps = steps
        self.last_loss = float("nan")
        self.last_accuracy = float("nan")

    def update(
        self,
        solver_tokens: torch.Tensor,
        solver_mask: torch.Tensor,
        agent_tokens: torch.Tensor,
        agent_mask: torch.Tensor,
    ) -> float:
        """A few steps of balanced binary cross-entropy: solver tokens 1, agent tokens 0."""
        bce = nn.BCEWithLogitsLoss()
        for _ in range(self.steps):
            pos = self.net(solver_tokens).squeeze(-1)[solver_mask.bool()]
            neg = self.net(agent_tokens).squeeze(-1)[agent_mask.bool()]
            loss = 0.5 * (bce(pos, torch.ones_like(pos)) + bce(neg, torch.zeros_like(neg)))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        with torch.no_grad():
            acc = 0.5 * ((pos > 0).float().mean() + (neg <= 0).float().mean())
        self.last_loss, self.last_accuracy = float(loss.detach()), float(acc)
        return self.last_loss

    @torch.no_grad()
    def energy(self, inputs) -> torch.Tensor:
        """``E = -log D = softplus(-logit)``, 0 outside the mask."""
        logit = self.net(inputs.tokens).squeeze(-1)
        return torch.nn.functional.softplus(-logit) * inputs.mask.float()


class UncertaintyEnsemble:
    """``K`` window heads predicting the next token where the environment writes it.

    Trained on every position whose next token is observation text written after the
    agent's first turn (the environment's replies), each head on its own bootstrap half of
    those positions. The energy of a trained token is the ensemble's disagreement there: the
    mean KL from each head's prediction to the ensemble mean (a Jensen–Shannon divergence).
    """

    def __init__(
        self,
        vocab_size: int,
        heads: int = 4,
        window: int = 4,
        lr: float = 3e-3,
        steps: int = 20,
        seed: int = 0,
    ) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.nets = nn.ModuleList(
                _WindowNet(vocab_size, vocab_size, window, dim=16, hidden=32) for _ in range(heads)
            )
        self.opt = torch.optim.Adam(self.nets.parameters(), lr=lr)
        self.steps = steps
        self.gen = torch.Generator().manual_seed(seed)
        self.last_loss = float("nan")

    @staticmethod
    def targets(
        roles: torch.Tensor, mask: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, T]`` bool: positions whose next token is environment text after a turn
        (padding, which has the observation role, is not, when ``attention_mask`` is given)."""
        agent_seen = mask.bool().cummax(1).values  # the agent has written by position t
        nxt_obs = torch.zeros_like(agent_seen)
        nxt_obs[:, :-1] = roles[:, 1:] == int(Role.OBSERVATION)
        if attention_mask is not None:
            nxt_obs[:, :-1] &= attention_mask[:, 1:].bool()
        return nxt_obs & agent_seen

    def update(
        self,
        tokens: torch.Tensor,
        roles: torch.Tensor,
        mask: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> float:
        where = self.targets(roles, mask, attention_mask)
        if not bool(where.any()):
            return float("nan")
        labels = tokens[:, 1:][where[:, :-1]]
        keep = [torch.rand(labels.shape, generator=self.gen) < 0.5 for _ in self.nets]
        for _ in range(self.steps):
            loss = 0.0
            for net, k in zip(self.nets, keep, strict=True):
                logits = net(tokens)[where]
                loss = loss + nn.functional.cross_entropy(logits[k], labels[k]) if k.any() else loss
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        self.last_loss = float(loss.detach()) / len(self.nets)
        return self.last_loss

    @torch.no_grad()
    def energy(self, inputs) -> torch.Tensor:
        logp = torch.stack([torch.log_softmax(n(inputs.tokens), -1) for n in self.nets])
        mean_p = logp.exp().mean(0)
        js = (logp.exp() * (logp - mean_p.clamp_min(1e-12).log()[None])).sum(-1).mean(0)
        return js * inputs.mask.float()


class NextObservationModel:
    """A window net predicting each token of the environment's replies.

    :meth:`bonus` puts on the last token of each turn the mean negative log-likelihood of the
    reply that follows it (0 where no reply follows); :meth:`update` then fits the model to
    the batch, so replies the agent keeps provoking stop paying.
    """

    def __init__(
        self, vocab_size: int, window: int = 4, lr: float = 3e-3, steps: int = 20, seed: int = 0
    ) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = _WindowNet(vocab_size, vocab_size, window, dim=16, hidden=32)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.steps = steps
        self.last_loss = float("nan")

    def _nll(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[B, T]``: at ``t`` the NLL of token ``t + 1`` (0 at the last position)."""
        logp = torch.log_softmax(self.net(tokens[:, :-1]), -1)
        nll = -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
        return torch.cat([nll, nll.new_zeros(nll.shape[0], 1)], 1)

    @torch.no_grad()
    def bonus(
        self,
        tokens: torch.Tensor,
        roles: torch.Tensor,
        mask: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        from tokenergy.safety import turn_ends

        ends = turn_ends(mask)
        # the replies' tokens, one step early (the position that predicts each)
        where = UncertaintyEnsemble.targets(roles, mask, attention_mask)
        seg = ends.long().cumsum(1)  # reply i follows turn i
        n_seg = int(seg.max()) + 1
        nll = self._nll(tokens) * where
        total = nll.new_zeros(tokens.shape[0], n_seg).scatter_add_(1, seg, nll)
        count = nll.new_zeros(tokens.shape[0], n_seg).scatter_add_(1, seg, where.to(nll.dtype))
        per_reply = total / count.clamp(min=1.0)
        return per_reply.gather(1, seg) * ends

    def update(
        self,
        tokens: torch.Tensor,
        roles: torch.Tensor,
        mask: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> float:
        where = UncertaintyEnsemble.targets(roles, mask, attention_mask)[:, :-1]
        if not bool(where.any()):
            return float("nan")
        labels = tokens[:, 1:][where]
        for _ in range(self.steps):
            logits = self.net(tokens[:, :-1])[where]
            loss = nn.functional.cross_entropy(logits, labels)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        self.last_loss = float(loss.detach())
        return self.last_loss

    def state_dict(self) -> dict:
        return {"net": self.net.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])

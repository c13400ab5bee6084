"""Data parallelism for the LM trainer: one process per device, started by ``accelerate launch``.

Under ``accelerate launch --num_processes N`` (or ``torchrun``, which sets the same
``WORLD_SIZE`` / ``RANK`` / ``LOCAL_RANK`` variables) every process holds a full copy of the
agent, generates its share of the episodes (whole GRPO groups) and computes the loss over its
share. The update equals the one a single process computes on the global batch:

- gradients are combined as ``g = Σ_r (n_r / N) g_r``, where ``g_r`` is process r's gradient
  of its token-mean loss, ``n_r`` its trained tokens in the minibatch and ``N = Σ_r n_r``: the
  gradient of the token mean over the global minibatch;
- advantages are whitened, and REINFORCE's baseline taken, over the global batch;
- the weights start equal (rank 0's are broadcast after SFT or a resume), so equal gradients
  keep them equal.

Logged metrics are averages over the processes (throughputs are summed); only rank 0 writes
the run folder. The backend is ``gloo`` on CPU and ``nccl`` on CUDA (each process takes
``cuda:LOCAL_RANK``). Models too large for one device (FSDP, DeepSpeed) go through TRL and
:mod:`tokenergy.integrations.trl`, which use accelerate's whole stack.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

__all__ = ["Parallel"]

T = TypeVar("T")


@dataclass(frozen=True)
class Parallel:
    """Where this process stands among the data-parallel processes (rank 0 of 1 by default)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, device: torch.device | str | None = None) -> Parallel:
        """Join the process group described by the launcher's environment (once per process).

        A single process (no ``WORLD_SIZE`` or ``WORLD_SIZE=1``) gets ``Parallel()`` and no
        process group.
        """
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
        if not dist.is_initialized():
            # torch.distributed.nn.functional binds ``group=group.WORLD`` as default arguments
            # when first imported, and transformers imports it lazily (through its FSDP
            # support) when a model class is first used. Imported after the group exists it
            # would pin the group for the life of the process: ``destroy_process_group`` could
            # not free it, and the backend's threads would die in interpreter finalization,
            # which aborts a finished run now and then. Imported first, it binds None.
            import torch.distributed.nn.functional

            cuda = device is not None and torch.device(device).type == "cuda"
            if cuda:
                torch.cuda.set_device(local)
            dist.init_process_group("nccl" if cuda else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), local)

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def close(self) -> None:
        """Leave the process group together: a barrier, then its teardown. Without it a rank
        that finished first exits while its peers' collectives are still alive, and the
        backend's threads can abort that process at interpreter exit."""
        if self.enabled and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """``cuda`` becomes this process's ``cuda:LOCAL_RANK``; other devices are unchanged."""
        if self.enabled and device.type == "cuda":
            return torch.device("cuda", self.local_rank)
        return device

    def shard(self, items: list[T], block: int = 1, what: str = "items") -> list[T]:
        """This process's contiguous share of ``items``, in whole blocks of ``block``.

        Every process must get the same number (collectives would otherwise wait forever), so
        the number of blocks must divide by the number of processes.
        """
        if not self.enabled:
            return items
        n_blocks = len(items) // block
        if n_blocks * block != len(items) or n_blocks % self.world:
            raise ValueError(
                f"{len(items)} {what} in blocks of {block} do not split evenly over "
                f"{self.world} processes; choose a multiple of {block * self.world}"
            )
        per = len(items) // self.world
        return items[self.rank * per : (self.rank + 1) * per]

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the processes (a new tensor; ``x`` itself on one process)."""
        if not self.enabled:
            return x
        out = x.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def token_share(self, mask: torch.Tensor) -> float:
        """This process's share ``n_r / N`` of the minibatch's trained tokens (1.0 alone,
        without a device sync)."""
        if not self.enabled:
            return 1.0
        n = mask.sum().float()
        return float(n / self.sum(n).clamp(min=1.0))

    def weight_rescale(self, mask: torch.Tensor, weights: torch.Tensor) -> float:
        """The factor ``(W_r / W) / (n_r / N)`` for a loss divided by this process's own
        weight sum ``W_r`` (``normalize="weights"``): multiplied by it, the loss's gradient,
        averaged over the processes by token share (:meth:`reduce_gradients`), is the gradient
        of ``sum(w * l) / sum(w)`` over the global minibatch (1.0 alone; 0.0 on a process with
        no trained token, whose loss is zero)."""
        if not self.enabled:
            return 1.0
        local = torch.stack([(weights * mask).sum(), mask.sum()]).double()
        total = self.sum(local)
        if float(local[1]) == 0.0 or float(local[0]) == 0.0:
            return 0.0
        return float((local[0] / total[0]) / (local[1] / total[1]))

    def all_true(self, flag: bool, device: torch.device) -> bool:
        """True when ``flag`` is true on every process."""
        if not self.enabled:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item() > 0)

    @torch.no_grad()
    def reduce_gradients(self, params: list[torch.Tensor], share: float) -> None:
        """Replace each gradient by ``Σ_r share_r · grad_r`` (one flat all-reduce).

        ``share`` is this process's part of the global minibatch (``n_r / N``); a parameter
        without a gradient here counts as zero, and every parameter has one afterwards.
        """
        if not self.enabled:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads]) * share
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    @torch.no_grad()
    def broadcast(self, module: torch.nn.Module) -> None:
        """Copy rank 0's parameters and buffers into every process's ``module``."""
        if not self.enabled:
            return
        for t in module.state_dict().values():
            dist.broadcast(t, src=0)

    def whiten(self, x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
        """:func:`tokenergy.ops.whiten` with the mean and variance of the global batch."""
        from tokenergy.ops import whiten

        if not self.enabled:
            return whiten(x, mask, eps=eps)
        m = mask.to(x.dtype)
        stats = self.sum(torch.stack([(x * m).sum(), (x * x * m).sum(), m.sum()]))
        n = stats[2].clamp(min=1.0)
        mean = stats[0] / n
        var = (stats[1] / n - mean * mean).clamp(min=0.0)
        return (x - mean) * torch.rsqrt(var + eps) * m

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """The mean of ``x``'s elements over every process's ``x`` (same shape on each)."""
        if not self.enabled:
            return x.mean()
        s = self.sum(torch.stack([x.sum(), torch.tensor(float(x.numel()), device=x.device)]))
        return s[0] / s[1]

    def average_metrics(self, row: dict[str, float], weight: float) -> dict[str, float]:
        """Metrics averaged over the processes with ``weight`` (e.g. episodes) each.

        ``*tokens_per_s`` throughputs are summed instead. Every process must pass the same keys.
        """
        if not self.enabled:
            return row
        gathered: list[tuple[dict[str, float], float] | None] = [None] * self.world
        dist.all_gather_object(gathered, (row, weight))
        total = sum(w for _, w in gathered) or 1.0
        out = {}
        for k in row:
            if k.endswith("tokens_per_s"):
                out[k] = sum(r[k] for r, _ in gathered)
            else:
                out[k] = sum(r[k] * w for r, w in gathered) / total
        return out

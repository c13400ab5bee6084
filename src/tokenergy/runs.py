"""Run folders: resolved config, metrics.jsonl, TensorBoard events, atomic checkpoints.

Layout of a run folder::

    config.yaml            resolved config
    metrics.jsonl          one JSON object per iteration (namespaced metric names)
    tb/                    TensorBoard events
    checkpoints/iter_000010/{model.safetensors, config.yaml, state.json}
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tokenergy.config import RunConfig, load_config, save_config

__all__ = [
    "Run",
    "RunDirError",
    "latest_checkpoint",
    "load_checkpoint",
    "load_trainer_state",
    "prepare_run_dir",
    "read_metrics",
]


class RunDirError(RuntimeError):
    """A run folder cannot be created, written or read."""


def prepare_run_dir(path: str | Path, overwrite: bool = False) -> Path:
    """Create an empty run folder, refusing to mix two runs in one folder."""
    p = Path(path)
    if p.exists() and any(p.iterdir()):
        if not overwrite:
            raise RunDirError(
                f"run folder {str(p)!r} already exists and is not empty; pass --overwrite or choose --out"
            )
        shutil.rmtree(p)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise RunDirError(f"cannot write run folder {str(p)!r}: {err.strerror or err}") from None
    return p


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Run:
    """Writes one run's outputs. Use as a context manager so files are closed on any exit."""

    def __init__(
        self,
        path: str | Path,
        cfg: RunConfig,
        overwrite: bool = False,
        resume_iteration: int | None = None,
    ) -> None:
        """Create a new run folder, or with ``resume_iteration`` reopen an existing one.

        Resuming keeps the folder and cuts ``metrics.jsonl`` back to the rows of iterations up
        to ``resume_iteration`` (the rows after the checkpoint are work that was lost and will
        be done again).
        """
        if resume_iteration is None:
            self.path = prepare_run_dir(path, overwrite)
            save_config(cfg, self.path / "config.yaml")
        else:
            self.path = Path(path)
            _truncate_metrics(self.path / "metrics.jsonl", resume_iteration)
        self.cfg = cfg
        self._metrics = open(self.path / "metrics.jsonl", "a")  # noqa: SIM115  (closed in close())
        self._tb = None
        if cfg.log.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.path / "tb"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one line to metrics.jsonl (flushed at once) and mirror it to TensorBoard."""
        row = {"train/global_step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        try:
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()
        except OSError as err:
            raise RunDirError(
                f"cannot write {str(self.path / 'metrics.jsonl')!r}: {err.strerror or err}"
            ) from None
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)

    def save_checkpoint(
        self,
        model: torch.nn.Module,
        iteration: int,
        state: dict[str, Any],
        trainer_state: dict[str, Any] | None = None,
    ) -> Path:
        """Write ``checkpoints/iter_N/`` atomically: into a temp folder, then one rename.

        ``trainer_state`` (optimizer, random generators, env states: whatever the trainer
        needs to continue exactly) goes to ``trainer.pt`` beside the weights.
        """
        ckpt_root = self.path / "checkpoints"
        ckpt_root.mkdir(exist_ok=True)
        final = ckpt_root / f"iter_{iteration:06d}"
        tmp = Path(tempfile.mkdtemp(dir=ckpt_root, prefix=".tmp-"))
        # clone: tied weights (embeddings = LM head) share memory, which safetensors refuses
        tensors = {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}
        try:
            save_file(tensors, str(tmp / "model.safetensors"))
            save_config(self.cfg, tmp / "config.yaml")
            if trainer_state is not None:
                torch.save(trainer_state, tmp / "trainer.pt")
            _atomic_write_text(
                tmp / "state.json", json.dumps({"iteration": iteration, **state}, indent=2)
            )
        except OSError as err:  # a full disk, say: leave no half-written checkpoint behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise RunDirError(
                f"cannot write checkpoint {str(final)!r}: {err.strerror or err}"
            ) from None
        if final.exists():
            _remove_atomically(final)
        os.replace(tmp, final)
        complete = sorted(p for p in ckpt_root.glob("iter_*") if p.is_dir())
        for old in complete[: -self.cfg.log.keep_checkpoints]:
            _remove_atomically(old)
        return final

    def close(self) -> None:
        self._metrics.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _truncate_metrics(path: Path, iteration: int) -> None:
    """Keep the rows of iterations ``<= iteration`` (and rows without one, e.g. SFT steps)."""
    if not path.is_file():
        raise RunDirError(f"{str(path)!r} not found: nothing to resume")
    keep = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the crash
        if row.get("train/iteration", 0) <= iteration:
            keep.append(line)
    _atomic_write_text(path, "".join(x + "\n" for x in keep))


def load_trainer_state(ckpt_dir: str | Path) -> dict[str, Any]:
    """The ``trainer.pt`` of a checkpoint (written by this library, so unpickling is trusted)."""
    p = Path(ckpt_dir) / "trainer.pt"
    if not p.is_file():
        raise RunDirError(f"checkpoint {str(ckpt_dir)!r} has no trainer.pt: it cannot be resumed")
    try:
        return torch.load(p, weights_only=False)
    except Exception as err:  # a torn or foreign file
        raise RunDirError(f"checkpoint file {str(p)!r} is corrupt: {err}") from None


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All rows of a run's metrics.jsonl (a truncated last line, from a crash, is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise RunDirError(f"{str(path)!r} not found: is {str(run_dir)!r} a run folder?")
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _remove_atomically(folder: Path) -> None:
    """Rename ``folder`` out of the ``iter_*`` namespace, then delete it: a kill during the
    deletion leaves a ``.del-*`` folder, never an ``iter_*`` one with files missing."""
    doomed = folder.with_name(f".del-{folder.name}-{os.getpid()}")
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest complete checkpoint folder of a run."""
    ckpts = sorted(
        p for p in (Path(run_dir) / "checkpoints").glob("iter_*") if (p / "state.json").is_file()
    )
    if not ckpts:
        raise RunDirError(f"no complete checkpoint under {str(Path(run_dir) / 'checkpoints')!r}")
    return ckpts[-1]


def load_checkpoint(
    ckpt_dir: str | Path,
) -> tuple[dict[str, torch.Tensor], RunConfig, dict[str, Any]]:
    """``(state_dict, config, state)`` of a checkpoint folder."""
    p = Path(ckpt_dir)
    try:
        tensors = load_file(str(p / "model.safetensors"))
        state = json.loads((p / "state.json").read_text())
    except (OSError, json.JSONDecodeError, Exception) as err:  # safetensors raises its own type
        raise RunDirError(f"checkpoint {str(p)!r} is missing or corrupt: {err}") from None
    return tensors, load_config(p / "config.yaml"), state

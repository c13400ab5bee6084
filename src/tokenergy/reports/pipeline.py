"""The pipeline's sizes × domains grid as a table (mean ± std over seeds of each run's
``summary.json``) and ``headroom.png``: the PPO gain against the SFT model's fluency."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tokenergy.models.lm import MODEL_SIZES

__all__ = ["GRID_COLUMNS", "grid_table"]


# (summary key, column title, digits)
GRID_COLUMNS = [
    ("sft/perplexity", "SFT ppl", 2),
    ("rm/accuracy", "RM acc", 3),
    ("sft/score_mean", "SFT score", 2),
    ("ppo/score_mean", "PPO score", 2),
    ("delta", "Δ", 2),
    ("win_rate", "win rate", 3),
    ("ppo/perplexity", "PPO ppl", 2),
    ("sft/distinct2", "SFT D-2", 3),
    ("ppo/distinct2", "PPO D-2", 3),
    ("ppo/collapsed", "collapsed", 2),
]


def _mean_std(values: list[float], digits: int) -> str:
    """Mean ± std over the finite values; ``(n NaN)`` says how many were not (collapsed)."""
    v = np.asarray(values, dtype=float)
    ok = v[np.isfinite(v)]
    text = f"{ok.mean():.{digits}f} ± {ok.std():.{digits}f}" if ok.size else "–"
    return text + (f" ({v.size - ok.size} NaN)" if ok.size < v.size else "")


def grid_table(out: str | Path) -> tuple[str, list[dict[str, Any]]]:
    """The markdown table of a grid folder (mean ± std over seeds, one row per size and
    domain) and its rows, and ``headroom.png``: Δ against the SFT model's perplexity."""
    out = Path(out)
    cells: dict[tuple[str, str], list[dict[str, float]]] = {}
    for f in sorted(out.glob("*/*/seed_*/summary.json")):
        size, domain = f.parts[-4], f.parts[-3]
        if size == "pretrain":
            continue
        cells.setdefault((size, domain), []).append(json.loads(f.read_text()))
    if not cells:
        raise ValueError(f"{out}: no finished runs (no <size>/<domain>/seed_*/summary.json)")
    order = {s: i for i, s in enumerate(MODEL_SIZES)}
    keys = sorted(cells, key=lambda c: (order.get(c[0], 99), c[1]))
    head = "| size | domain | seeds | " + " | ".join(t for _, t, _ in GRID_COLUMNS) + " |"
    lines = [head, "|" + "---|" * (3 + len(GRID_COLUMNS))]
    rows = []
    for size, domain in keys:
        runs = cells[(size, domain)]
        vals = [_mean_std([r.get(k, float("nan")) for r in runs], d) for k, _, d in GRID_COLUMNS]
        lines.append(f"| {size} | {domain} | {len(runs)} | " + " | ".join(vals) + " |")
        rows.append(
            {
                "size": size,
                "domain": domain,
                **{k: [r[k] for r in runs] for k, _, _ in GRID_COLUMNS},
            }
        )
    _headroom_plot(rows, out / "headroom.png")
    md = "\n".join(lines) + "\n"
    (out / "table.md").write_text(md)
    return md, rows


def _headroom_plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    markers = {"story": "o", "news": "s", "facts": "^"}
    sizes = sorted({r["size"] for r in rows}, key=[r["size"] for r in rows].index)
    colors = {s: f"C{i}" for i, s in enumerate(sizes)}
    for r in rows:
        for ax, key in zip(axes, ("delta", "win_rate"), strict=True):
            ax.scatter(
                r["sft/perplexity"],
                r[key],
                marker=markers.get(r["domain"], "x"),
                color=colors[r["size"]],
                label=f"{r['size']} {r['domain']}",
                alpha=0.8,
            )
    axes[0].set_ylabel("Δ reward-model score (PPO − SFT)")
    axes[1].set_ylabel("analytic win rate of PPO over SFT")
    axes[1].axhline(0.5, color="grey", lw=0.8, ls="--")
    axes[0].axhline(0.0, color="grey", lw=0.8, ls="--")
    for ax in axes:
        ax.set_xlabel("SFT perplexity, held out (lower = more fluent)")
    handles, labels = axes[0].get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    fig.legend(seen.values(), seen.keys(), loc="center right", fontsize=7)
    fig.suptitle(
        "capacity headroom: the PPO gain against the SFT model's fluency (one point per seed)"
    )
    fig.tight_layout(rect=(0, 0, 0.85, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""Reports made from run folders (``metrics.jsonl``), never from training code.

``tokenergy report DIR`` accepts a run folder or an ablation folder and writes
``DIR/report/``: ``curves.png`` (mean ± std bands over seeds), ``report.md`` and a
self-contained ``report.html`` (the picture inlined) with the steps-to-threshold and
final-return table.
"""

from __future__ import annotations

import base64
import html
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import yaml

from tokenergy.runs import RunDirError, read_metrics

__all__ = [
    "VariantSummary",
    "final_value",
    "load_ablation",
    "steps_to_threshold",
    "summarize",
    "write_report",
]

STEP = "train/global_step"


def steps_to_threshold(rows: list[dict[str, Any]], metric: str, threshold: float) -> int | None:
    """The first ``train/global_step`` at which ``metric >= threshold``; ``None`` if never."""
    for row in rows:
        v = row.get(metric)
        if v is not None and v >= threshold:
            return int(row[STEP])
    return None


def final_value(rows: list[dict[str, Any]], metric: str, frac: float = 0.1) -> float:
    """Mean of ``metric`` over the last ``frac`` of iterations (at least one)."""
    values = [r[metric] for r in rows if r.get(metric) is not None]
    if not values:
        return math.nan
    k = max(1, int(len(values) * frac))
    return float(np.mean(values[-k:]))


def _curve(rows: list[dict[str, Any]], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Steps and values of ``metric``; a metric logged only at some rows (an evaluation every
    n iterations) keeps those rows, so its points join into a line."""
    if any(metric not in r for r in rows) and any(metric in r for r in rows):
        rows = [r for r in rows if metric in r]
    steps = np.array([r[STEP] for r in rows], dtype=float)
    values = np.array([np.nan if r.get(metric) is None else r[metric] for r in rows], dtype=float)
    return steps, values


@dataclass
class VariantSummary:
    """One variant's numbers over its seeds."""

    name: str
    seeds: int
    solved: int
    steps_mean: float  # over solved seeds; nan when none solved
    steps_std: float
    final_mean: float
    final_std: float
    steps: list[int | None]


def load_ablation(root: str | Path) -> dict[str, list[list[dict[str, Any]]]]:
    """``{variant: [rows of seed 0, rows of seed 1, ...]}`` from an ablation folder.

    A single run folder loads as one variant (its folder name) with one seed.
    """
    root = Path(root)
    if not root.is_dir():
        raise RunDirError(f"{str(root)!r} is not a folder")
    if (root / "metrics.jsonl").is_file():
        return {root.name: [read_metrics(root)]}
    order: list[str] = []
    if (root / "ablation.yaml").is_file():
        order = list(yaml.safe_load((root / "ablation.yaml").read_text()).get("variants", []))
    found = sorted(
        p.name for p in root.iterdir() if p.is_dir() and any(p.glob("seed_*/metrics.jsonl"))
    )
    names = [n for n in order if n in found] + [n for n in found if n not in order]
    if not names:
        raise RunDirError(
            f"{str(root)!r} holds neither metrics.jsonl nor <variant>/seed_*/metrics.jsonl"
        )
    out = {}
    for name in names:
        seed_dirs = sorted(
            (root / name).glob("seed_*/metrics.jsonl"),
            key=lambda p: int(p.parent.name.split("_")[1]),
        )
        out[name] = [read_metrics(p.parent) for p in seed_dirs]
    return out


def summarize(
    runs: dict[str, list[list[dict[str, Any]]]],
    metric: str,
    threshold: float,
    final_metric: str = "rollout/return",
) -> list[VariantSummary]:
    """Steps to threshold and final value per variant, mean ± std over seeds."""
    out = []
    for name, seeds in runs.items():
        steps = [steps_to_threshold(rows, metric, threshold) for rows in seeds]
        solved = [s for s in steps if s is not None]
        finals = [final_value(rows, final_metric) for rows in seeds]
        out.append(
            VariantSummary(
                name=name,
                seeds=len(seeds),
                solved=len(solved),
                steps_mean=float(np.mean(solved)) if solved else math.nan,
                steps_std=float(np.std(solved)) if solved else math.nan,
                final_mean=float(np.nanmean(finals)) if finals else math.nan,
                final_std=float(np.nanstd(finals)) if finals else math.nan,
                steps=steps,
            )
        )
    return out


def _fmt(mean: float, std: float, digits: int = 0) -> str:
    if math.isnan(mean):
        return "—"
    return f"{mean:,.{digits}f} ± {std:,.{digits}f}"


def table_rows(
    summary: list[VariantSummary], metric: str, threshold: float
) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the summary table (strings), shared by markdown, HTML and the CLI."""
    base = summary[0]
    header = [
        "variant",
        "seeds solved",
        f"steps to {metric} ≥ {threshold:g} (mean ± std)",
        f"vs {base.name}",
        "final return (mean ± std)",
    ]
    rows = []
    for s in summary:
        rel = "—"
        if s is not base and not math.isnan(s.steps_mean) and not math.isnan(base.steps_mean):
            rel = f"{100.0 * (s.steps_mean - base.steps_mean) / base.steps_mean:+.1f}%"
        rows.append(
            [
                s.name,
                f"{s.solved}/{s.seeds}",
                _fmt(s.steps_mean, s.steps_std),
                rel,
                _fmt(s.final_mean, s.final_std, 3),
            ]
        )
    return header, rows


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def step_label(runs: dict[str, list[list[dict[str, Any]]]]) -> str:
    """What ``train/global_step`` counts: an LM run's counts episodes (it logs
    ``train/episodes``), a vector run's environment steps."""
    lm = any("train/episodes" in r for seeds in runs.values() for rows in seeds for r in rows)
    return "training episodes" if lm else "environment steps"


def plot_curves(
    runs: dict[str, list[list[dict[str, Any]]]],
    metrics: list[str],
    path: Path,
    thresholds: dict[str, float] | None = None,
) -> Path:
    """One panel per metric; per variant the mean over seeds with a ±1 std band."""
    n = len(metrics)
    cols = 2 if n > 1 else 1
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.2 * cols, 3.6 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    x_label = step_label(runs)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for i, (name, seeds) in enumerate(runs.items()):
            curves = [_curve(rows, metric) for rows in seeds if rows]
            if not curves:
                continue
            length = min(len(c[0]) for c in curves)
            steps = curves[0][0][:length]
            vals = np.stack([c[1][:length] for c in curves])
            if np.all(np.isnan(vals)):
                continue
            with warnings.catch_warnings():  # all-NaN columns (no episode finished yet) are fine
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, std = np.nanmean(vals, axis=0), np.nanstd(vals, axis=0)
            color = colors[i % len(colors)]
            ax.plot(steps, mean, color=color, label=f"{name} (n={len(curves)})", lw=1.8)
            if len(curves) > 1:
                ax.fill_between(steps, mean - std, mean + std, color=color, alpha=0.18, lw=0)
        if thresholds and metric in thresholds:
            ax.axhline(
                thresholds[metric],
                color="0.4",
                ls="--",
                lw=1,
                label=f"threshold {thresholds[metric]:g}",
            )
        ax.set_title(metric)
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


DEFAULT_PANELS = [
    "rollout/return",
    "rollout/success",
    "weights/bottleneck_ratio",
    "energy/std",
    "loss/entropy",
    "train/approx_kl",
]


def write_report(
    root: str | Path,
    metric: str | None = None,
    threshold: float | None = None,
    panels: list[str] | None = None,
) -> tuple[Path, str]:
    """Write ``root/report/{curves.png, report.md, report.html}``.

    The threshold metric and value default to the run's ``ablation`` config section.

    Returns:
        ``(report folder, markdown table)``.
    """
    root = Path(root)
    runs = load_ablation(root)
    if metric is None or threshold is None:
        m, t = _threshold_from_config(root)
        metric = metric or m
        threshold = t if threshold is None else threshold
    present = {k for seeds in runs.values() for rows in seeds for r in rows for k in r}
    missing = sorted(set(panels or []) - present)
    if missing:
        raise RunDirError(f"{str(root)!r}: no run logged {', '.join(missing)}")
    panels = [p for p in (panels or DEFAULT_PANELS) if p in present]
    out = root / "report"
    out.mkdir(exist_ok=True)
    png = plot_curves(runs, panels, out / "curves.png", {metric: threshold})
    summary = summarize(runs, metric, threshold)
    header, rows = table_rows(summary, metric, threshold)
    md_table = _markdown_table(header, rows)
    per_seed = "\n".join(
        f"- {s.name}: " + ", ".join("never" if x is None else f"{x:,}" for x in s.steps)
        for s in summary
    )
    md = (
        f"# Report: {root.name}\n\n{md_table}\n\n"
        f"Steps to threshold per seed (first iteration whose {metric} over the episode window reaches "
        f"{threshold:g}):\n\n{per_seed}\n\nMeans and stds of steps are over the seeds that reached the "
        "threshold; final return is the mean over the last 10% of iterations.\n\n![curves](curves.png)\n"
    )
    (out / "report.md").write_text(md)
    img = base64.b64encode(png.read_bytes()).decode()
    th = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    tr = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>tokenergy report: {html.escape(root.name)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}
td:first-child,th:first-child{{text-align:left}}img{{max-width:100%}}</style></head><body>
<h1>{html.escape(root.name)}</h1><table><tr>{th}</tr>{tr}</table>
<p>Steps per seed:<br>{html.escape(per_seed).replace(chr(10), "<br>")}</p>
<img src="data:image/png;base64,{img}" alt="learning curves"></body></html>"""
    (out / "report.html").write_text(page)
    return out, md_table


def _threshold_from_config(root: Path) -> tuple[str, float]:
    candidates = [root / "ablation.yaml", root / "config.yaml"]
    for c in candidates:
        if c.is_file():
            data = yaml.safe_load(c.read_text()) or {}
            data = data.get("base", data)
            ab = data.get("ablation", {})
            if ab:
                return ab.get("threshold_metric", "rollout/success"), float(
                    ab.get("threshold", 0.9)
                )
    return "rollout/success", 0.9

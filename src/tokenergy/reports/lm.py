"""Reports of LM runs, made from run folders (``metrics.jsonl``, ``samples.jsonl``) only.

- :func:`write_token_report`: ``<run>/report/tokens.html``, trajectories as coloured tokens
  (energy, loss weight, advantage; hover a token for its numbers), and
  ``energy_turns.png``, the mean energy of reasoning and action tokens per turn, early vs
  late in training.
- :func:`write_diagnose`: the action-bottleneck diagnostic over training
  (``diag/*`` metrics) as ``<run>/report/diagnose.png`` and a table.
- :func:`write_lm_ablation_report`: an LM ablation folder
  (``<env>/<variant>/seed_<k>``) as a success table (final-step held-out success,
  mean ± std over seeds), success curves per environment, the diagnostic per variant, and
  links to each environment's token pictures.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import yaml

from tokenergy.credit.diagnostics import mean_interval
from tokenergy.runs import RunDirError, read_metrics
from tokenergy.types import Role

__all__ = [
    "final_diagnostic",
    "is_lm_ablation",
    "read_samples",
    "write_diagnose",
    "write_lm_ablation_report",
    "write_token_report",
]

_ROLE_NAMES = {int(r): r.name.lower() for r in Role}
_NEWLINE = "⏎"


def read_samples(run_dir: Path) -> list[dict[str, Any]]:
    """The trajectories a run kept in ``samples.jsonl`` (empty when it kept none)."""
    path = Path(run_dir) / "samples.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# --------------------------------------------------------------------------- token pictures


def _rgb(t: float, lo: tuple[int, int, int], hi: tuple[int, int, int]) -> str:
    t = min(max(t, 0.0), 1.0)
    c = [round(a + (b - a) * t) for a, b in zip(lo, hi, strict=True)]
    return f"rgb({c[0]},{c[1]},{c[2]})"


def _colour(view: str, value: float, scale: float) -> str:
    if view == "advantage":  # diverging: red below 0, green above
        t = value / scale if scale > 0 else 0.0
        return (
            _rgb(t, (255, 255, 255), (80, 190, 90))
            if t >= 0
            else _rgb(-t, (255, 255, 255), (230, 90, 80))
        )
    t = value / scale if scale > 0 else 0.0
    return _rgb(t, (255, 255, 255), (240, 120, 40) if view == "energy" else (70, 120, 230))


def _trajectory_html(sample: dict[str, Any], view: str) -> str:
    roles = sample["roles"]
    values = sample.get(view) or [0.0] * len(roles)
    agent = [v for v, r in zip(values, roles, strict=True) if r != int(Role.OBSERVATION)]
    if view == "energy" and agent:
        lo = min(agent)
        shifted = [v - lo for v in values]
        scale = max((v - lo for v in agent), default=0.0)
    else:
        shifted = values
        scale = max((abs(v) for v in agent), default=0.0)
    out = []
    for i, (tok, role) in enumerate(zip(sample["tokens"], roles, strict=True)):
        if tok in ("<pad>",):
            continue
        tip = f"{_ROLE_NAMES.get(role, role)}"
        for key in ("energy", "weight", "advantage", "logprob"):
            if key in sample:
                tip += f" | {key} {sample[key][i]:+.3f}"
        text = html.escape(tok)
        if role == int(Role.OBSERVATION):
            cls, style = "obs", ""
        else:
            cls = _ROLE_NAMES.get(role, "agent")
            style = f' style="background:{_colour(view, shifted[i], scale)}"'
        out.append(f'<span class="{cls}"{style} title="{html.escape(tip)}">{text}</span>')
        if tok == _NEWLINE:
            out.append("<br>")
    return " ".join(out)


def _turn_index(roles: list[int]) -> list[int]:
    """Per token, the number of agent turns that ended before it (observation tokens get
    the index of the turn they precede)."""
    turn, out, in_agent = 0, [], False
    for r in roles:
        if r != int(Role.OBSERVATION):
            in_agent = True
        elif in_agent:
            turn, in_agent = turn + 1, False
        out.append(turn)
    return out


def _energy_by_turn(samples: list[dict[str, Any]], role: Role) -> tuple[list[int], list[float]]:
    per_turn: dict[int, list[float]] = {}
    for s in samples:
        if "energy" not in s:
            continue
        for t, r, e in zip(_turn_index(s["roles"]), s["roles"], s["energy"], strict=True):
            if r == int(role):
                per_turn.setdefault(t, []).append(e)
    turns = sorted(per_turn)
    return turns, [statistics.mean(per_turn[t]) for t in turns]


def _save(fig, ax, path: Path, fontsize: int = 8) -> Path:
    """Legend (when anything is labelled) on ``ax``, tight layout, PNG at ``path``, closed."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _img(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


_CSS = """body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;color:#222}
.traj{font-family:ui-monospace,monospace;font-size:13px;line-height:1.9;border:1px solid #ddd;
padding:8px;margin:6px 0 18px}.traj span{padding:1px 2px;border-radius:3px}
.obs{color:#999}.reasoning{font-style:italic}.action{font-weight:bold;outline:1px solid #555}
.format{color:#555}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 10px;
text-align:right}td:first-child,th:first-child{text-align:left}img{max-width:100%}
.legend span{padding:2px 8px;margin-right:6px;border-radius:3px}"""


def write_token_report(run_dir: str | Path, per_iteration: int = 1) -> Path | None:
    """Write ``<run>/report/tokens.html`` and ``energy_turns.png``; ``None`` without samples.

    Shows ``per_iteration`` trajectories of the first and of the last logged iteration.
    """
    run_dir = Path(run_dir)
    samples = read_samples(run_dir)
    if not samples:
        return None
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    iterations = sorted({s["iteration"] for s in samples})
    first, last = iterations[0], iterations[-1]
    early = [s for s in samples if s["iteration"] == first]
    late = [s for s in samples if s["iteration"] == last]
    # The curves average the first and the last third of the logged iterations.
    third = max(1, len(iterations) // 3)
    early_its, late_its = iterations[:third], iterations[-third:]
    early_all = [s for s in samples if s["iteration"] in early_its]
    late_all = [s for s in samples if s["iteration"] in late_its]

    def span(its: list[int]) -> str:
        return f"iteration {its[0]}" if len(its) == 1 else f"iterations {its[0]}–{its[-1]}"

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for group, ls, label in ((early_all, "--", span(early_its)), (late_all, "-", span(late_its))):
        for role, color in ((Role.REASONING, "tab:purple"), (Role.ACTION, "tab:orange")):
            turns, mean = _energy_by_turn(group, role)
            if turns:
                ax.plot(
                    [t + 1 for t in turns], mean, ls, color=color, marker="o", ms=3,
                    label=f"{role.name.lower()}, {label}",
                )  # fmt: skip
    ax.set_xlabel("turn")
    ax.set_ylabel("mean token energy")
    ax.set_title(f"energy over turns ({len(early_all)} and {len(late_all)} logged trajectories)")
    ax.grid(alpha=0.3)
    png = _save(fig, ax, out / "energy_turns.png")

    cfg_path = run_dir / "config.yaml"
    energy_cfg = (
        (yaml.safe_load(cfg_path.read_text()) or {}).get("energy", {}) if cfg_path.is_file() else {}
    )
    source = energy_cfg.get("source", "?")
    sections = []
    for s in early[:per_iteration] + late[:per_iteration]:
        head = (
            f"<h3>iteration {s['iteration']}, episode {s['episode']}: return {s['return']:+.2f}, "
            f"{'success' if s['success'] else 'failure'}</h3>"
        )
        views = "".join(
            f"<h4>{view}</h4><div class='traj'>{_trajectory_html(s, view)}</div>"
            for view in ("energy", "weight", "advantage")
            if view in s
        )
        sections.append(head + views)
    legend = (
        "<p class='legend'><span style='background:rgb(240,120,40)'>high energy</span>"
        "<span style='background:rgb(70,120,230);color:white'>high weight</span>"
        "<span style='background:rgb(80,190,90)'>positive advantage</span>"
        "<span style='background:rgb(230,90,80)'>negative advantage</span>"
        "<span class='obs'>grey: observation (never trained)</span> <b>bold, outlined</b>: "
        "action tokens, <i>italic</i>: reasoning. Hover a token for its numbers.</p>"
    )
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>tokens: {html.escape(run_dir.name)}"
        f"</title><style>{_CSS}</style></head><body><h1>{html.escape(run_dir.name)}: tokens</h1>"
        f"<p>energy source: <code>{html.escape(str(source))}</code>; energy is scaled per "
        f"trajectory (white = its lowest agent token), weight and advantage by their largest "
        f"magnitude.</p>{legend}"
        f"<img src='data:image/png;base64,{_img(png)}' alt='energy over turns'>"
        + "".join(sections)
        + "</body></html>"
    )
    page_path = out / "tokens.html"
    page_path.write_text(page)
    return page_path


# --------------------------------------------------------------------------- diagnostic


def _diag_series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if v is not None and "train/iteration" in r and not math.isnan(v):
            xs.append(int(r["train/iteration"]))
            ys.append(float(v))
    return xs, ys


def write_diagnose(run_dir: str | Path, rows: list[dict[str, Any]] | None = None):
    """The action-bottleneck diagnostic of one run over training.

    Returns:
        ``(png path, markdown table)``, the table also written to ``report/diagnose.md``; it
        has one row per evaluation with mean ``|corr|`` and token share of action and
        reasoning tokens, and the paper's energy diagnostic: Spearman's rho (p) between the
        groups' return std and their mean energy.
    """
    run_dir = Path(run_dir)
    rows = rows if rows is not None else read_metrics(run_dir)
    diag = [r for r in rows if "diag/share_action" in r]
    if not diag:
        raise RunDirError(
            f"{str(run_dir)!r} has no diag/* metrics; train with --eval.diagnose-seeds 8 "
            "(or run `tokenergy diagnose RUN --now`)"
        )
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for role, color in (("action", "tab:orange"), ("reasoning", "tab:purple")):
        xs, ys = _diag_series(diag, f"diag/corr_{role}")
        ax.plot(xs, ys, color=color, marker="o", label=f"|corr| {role}")
        xs, ys = _diag_series(diag, f"diag/share_{role}")
        ax.plot(xs, ys, color=color, ls=":", label=f"token share {role}")
    ax.set_xlabel("RL iteration")
    ax.set_ylim(0, 1)
    ax.set_title("action bottleneck: |corr(Σ log π, return)| vs share of tokens")
    ax.grid(alpha=0.3)
    png = _save(fig, ax, out / "diagnose.png")

    def f(v: Any) -> str:
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

    def rho(r: dict[str, Any], part: str) -> str:
        v, p = r.get(f"diag/energy_spearman_{part}"), r.get(f"diag/energy_p_{part}")
        if v is None or math.isnan(v):
            return "—"
        return f"{v:+.3f} (p {p:.2g})"

    lines = [
        "| iteration | action abs corr | action share | reasoning abs corr | reasoning share "
        "| groups | energy rho, action | energy rho, reasoning | energy rho, all |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in diag:
        lines.append(
            f"| {int(r.get('train/iteration', 0))} | {f(r.get('diag/corr_action'))} | "
            f"{f(r.get('diag/share_action'))} | {f(r.get('diag/corr_reasoning'))} | "
            f"{f(r.get('diag/share_reasoning'))} | {int(r.get('diag/energy_groups', 0))} | "
            f"{rho(r, 'action')} | {rho(r, 'reasoning')} | {rho(r, 'all')} |"
        )
    (out / "diagnose.md").write_text("\n".join(lines) + "\n")
    return png, "\n".join(lines)


# --------------------------------------------------------------------------- LM ablations


def is_lm_ablation(root: str | Path) -> bool:
    path = Path(root) / "ablation.yaml"
    if not path.is_file():
        return False
    return "envs" in (yaml.safe_load(path.read_text()) or {})


def _mean_std(xs: list[float]) -> str:
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return "—"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3f} ± {sd:.3f}"


def _evals(rows: list[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    return [(int(r["train/iteration"]), float(r[metric])) for r in rows if metric in r]


def write_lm_ablation_report(root: str | Path) -> tuple[Path, str]:
    """Write ``<root>/report/{report.md, report.html, curves.png, diagnose.png}`` and each
    environment's token pictures; returns ``(folder, markdown table)``. Only finished runs
    (those with their ``agent/`` saved) count."""
    root = Path(root)
    meta = yaml.safe_load((root / "ablation.yaml").read_text())
    envs, variants = meta["envs"], meta["variants"]
    metric = (meta.get("base", {}).get("ablation", {}) or {}).get("metric", "eval/success")
    runs: dict[str, dict[str, list[list[dict[str, Any]]]]] = {}
    dirs: dict[str, dict[str, list[Path]]] = {}
    for env in envs:
        for variant in ["sft", *variants]:
            for d in sorted((root / env / variant).glob("seed_*/agent")):  # finished runs
                # an SFT agent copied in (its folder holds the agent alone) has no metrics
                rows = read_metrics(d.parent) if (d.parent / "metrics.jsonl").is_file() else []
                runs.setdefault(env, {}).setdefault(variant, []).append(rows)
                dirs.setdefault(env, {}).setdefault(variant, []).append(d.parent)
    if not runs:
        raise RunDirError(f"{str(root)!r} holds no finished runs yet")
    out = root / "report"
    out.mkdir(exist_ok=True)
    header = ["variant", *envs]
    table, _ = _success_table(runs, envs, variants, metric, lambda ev: ev[-1][1])
    peak_table, _ = _success_table(runs, envs, variants, metric, lambda ev: max(v for _, v in ev))
    drop_table, _ = _success_table(
        runs, envs, variants, metric, lambda ev: max(v for _, v in ev) - ev[-1][1]
    )
    md_table = _markdown(header, table)
    extra = ""  # what the agent still reads, and how often its turns are invalid, at the end
    for key, what in (("eval/state_exact", "scratchpads that state the state exactly"),
                      ("eval/invalid_rate", "invalid turns")):  # fmt: skip
        rows, _ = _success_table(runs, envs, variants, key, lambda ev: ev[-1][1])
        if any(cell != "—" for row in rows for cell in row[1:]):
            extra += f"Final-step `{key}` ({what}):\n\n{_markdown(header, rows)}\n\n"
    by_seed = {
        (env, variant): {
            run_dir.name: ev[-1][1]
            for rows, run_dir in zip(runs[env][variant], dirs[env][variant], strict=True)
            if (ev := _evals(rows, metric))
        }
        for env in runs
        for variant in runs[env]
    }
    deltas = _paired_deltas(by_seed, envs, variants)
    _success_curves(runs, envs, variants, metric, out / "curves.png")
    _, diag_md = _diagnostic_section(runs, envs, variants, out / "diagnose.png")
    energy_md = _energy_diagnostic_section(runs, dirs, envs, variants)
    substrate_md = _substrate_section(runs, dirs, envs)
    weight_md = _weight_section(root, runs, envs, variants)
    token_links = []
    for env in envs:
        for variant in [v for v in ("ppo", "actfocus-ppo", "actfocus") if v in variants]:
            if not (root / env / variant / "seed_0" / "agent").is_dir():
                continue  # not finished
            page = write_token_report(root / env / variant / "seed_0")
            if page is not None:
                token_links.append((f"{env} / {variant}", page.relative_to(root)))
    seeds_n = meta.get("seeds", "?")
    text = (
        f"# LM ablation: {root.name}\n\nFinal-step held-out {metric} (the last evaluation), "
        f"mean ± std over {seeds_n} seeds; every variant of an env and seed starts from the "
        f"same SFT agent (first row).\n\n{md_table}\n\n"
        + "\n".join(deltas)
        + "\n\n"
        + (
            "The SFT agents every variant starts from (held-out evaluation at iteration 0; "
            "state_exact: the share of turns whose scratchpad states the state word for word; "
            "the gate is `sft.min_state_exact`):\n\n"
            f"{substrate_md}\n\n"
            if substrate_md
            else ""
        )
        + f"Peak held-out {metric} (the best evaluation of each run):\n\n"
        f"{_markdown(header, peak_table)}\n\n"
        "Peak-to-final drop (peak minus final, per run):\n\n"
        f"{_markdown(header, drop_table[1:])}\n\n{extra}"
        "![success curves](curves.png)\n\n"
        + (
            "Action-bottleneck diagnostic (mean over evaluations and seeds):\n\n"
            f"{diag_md}\n\n![diagnostic](diagnose.png)\n\n"
            if diag_md
            else ""
        )
        + (
            "The ActFocus paper's diagnostic at the SFT start and at the final agents "
            "(Spearman's rho between the groups' return std and their mean energy; mean ± std "
            "over seeds, and on how many seeds p < 0.05):\n\n"
            f"{energy_md}\n\n"
            if energy_md
            else ""
        )
        + "Where the loss weight went (every RL iteration, all seeds):\n\n"
        + f"{weight_md}\n\nPer-token pictures:\n\n"
        + "\n".join(f"- {label}: `{path}`" for label, path in token_links)
        + "\n"
    )
    (out / "report.md").write_text(text)
    (out / "report.html").write_text(markdown_page(text, out, root.name))
    return out, md_table


def _substrate_section(runs, dirs, envs) -> str:
    """One row per finished SFT run: its held-out success and state_exact at iteration 0, the
    SFT rounds it took and whether it met its perception gate."""
    rows = []
    for env in envs:
        for metrics, run_dir in zip(
            runs.get(env, {}).get("sft", []), dirs.get(env, {}).get("sft", []), strict=True
        ):
            start = next((r for r in metrics if r.get("train/iteration") == 0), None)
            if start is None:
                continue  # an agent copied in without its run's metrics
            rounds = max((int(r["sft/round"]) for r in metrics if "sft/round" in r), default=1)
            saved = run_dir / "config.yaml"
            sft = (
                (yaml.safe_load(saved.read_text()) or {}).get("sft", {}) if saved.is_file() else {}
            )
            gate = float(sft.get("min_state_exact", 0.0))
            failed = any(r.get("sft/gate_failed") for r in metrics)
            seen = start.get("eval/state_exact")
            rows.append([
                env,
                run_dir.name,
                f"{start['eval/success']:.3f}",
                "—" if seen is None else f"{seen:.3f}",
                str(rounds),
                "none" if gate <= 0 else f"{gate:g}: " + ("missed" if failed else "met"),
            ])  # fmt: skip
    header = ["env", "seed", "success", "state_exact", "SFT rounds", "gate"]
    return _markdown(header, rows) if rows else ""


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(md + ["| " + " | ".join(r) + " |" for r in rows])


def _success_table(runs, envs, variants, metric, pick) -> tuple[list[list[str]], dict]:
    """Rows of ``pick(evaluations)`` per variant and env (mean ± std over seeds), led by the
    SFT start, and the per-seed values of each (env, variant)."""
    table, values = [], {}
    start_row = ["SFT start"]
    for env in envs:
        # every variant of a seed starts from the same agent: the SFT runs' own evaluations
        # give the starts, or (SFT agents copied in without metrics) the first variant with
        # finished runs
        sft = [rows for rows in runs.get(env, {}).get("sft", []) if _evals(rows, metric)]
        done = [v for v in variants if runs.get(env, {}).get(v)]
        first = sft or (runs[env][done[0]] if done else [])
        starts = [ev[0][1] for rows in first if (ev := _evals(rows, metric))]
        start_row.append(_mean_std(starts))
    table.append(start_row)
    for variant in variants:
        row = [variant]
        for env in envs:
            seeds = runs.get(env, {}).get(variant, [])
            vals = [pick(ev) for rows in seeds if (ev := _evals(rows, metric))]
            values[(env, variant)] = vals
            row.append(_mean_std(vals) + (f" (n={len(vals)})" if vals else ""))
        table.append(row)
    return table, values


def _paired_deltas(by_seed: dict, envs: list[str], variants: list[str]) -> list[str]:
    """The differences of the compared variants in points, paired by seed (both variants of a
    seed start from the same SFT agent) over the seeds both have finished: mean ± std, the 95%
    t interval of the mean, and the seeds on which the first variant is ahead. ``by_seed``
    maps ``(env, variant)`` to ``{seed folder: final value}``."""

    def delta(a: str, b: str) -> str:
        parts = []
        for env in envs:
            x, y = by_seed.get((env, a), {}), by_seed.get((env, b), {})
            common = sorted(set(x) & set(y))
            if common:
                d = [100 * (x[k] - y[k]) for k in common]
                sd = statistics.stdev(d) if len(d) > 1 else 0.0
                mean, half = mean_interval(d)
                ci = (
                    "" if math.isnan(half) else f", 95% CI {mean - half:+.1f} to {mean + half:+.1f}"
                )
                wins = sum(v > 0 for v in d)
                parts.append(f"{env} {mean:+.1f} ± {sd:.1f}{ci} ({wins}/{len(d)} seeds)")
        return ", ".join(parts)

    pairs = (
        ("actfocus-ppo", "ppo"),
        ("actfocus-grpo", "grpo"),
        ("actfocus-ppo", "grpo"),
        ("downweight-only", "ppo"),
        ("redistribute-only", "ppo"),
        ("actfocus-ppo", "shuffled"),
    )
    return [
        f"- {a} − {b} (final step, points, paired by seed, mean ± std): {d}"
        for a, b in pairs
        if a in variants and b in variants and (d := delta(a, b))
    ]


def _success_curves(runs, envs, variants, metric, path: Path) -> Path:
    """Held-out success over training per env, mean ± std band over seeds per variant."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(envs), figsize=(5.2 * len(envs), 3.8), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        for i, variant in enumerate(variants):
            curves = [_evals(rows, metric) for rows in runs.get(env, {}).get(variant, [])]
            curves = [c for c in curves if c]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            xs = [it for it, _ in curves[0][:n]]
            ys = np.array([[v for _, v in c[:n]] for c in curves])
            mean, sd = ys.mean(0), ys.std(0)
            ax.plot(xs, mean, marker="o", ms=3, color=colors[i % len(colors)], label=variant)
            ax.fill_between(xs, mean - sd, mean + sd, color=colors[i % len(colors)], alpha=0.12)
        ax.set_title(f"{env}: {metric}")
        ax.set_xlabel("RL iteration (0 = SFT start)")
        ax.grid(alpha=0.3)
    return _save(fig, axes[0][-1], path, fontsize=7)


def _diagnostic_section(runs, envs, variants, path: Path) -> tuple[Path, str]:
    """|corr| of action vs reasoning tokens' log-probs with the return, per variant over
    training (a picture), and its means over evaluations and seeds (a table)."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(envs), figsize=(5.2 * len(envs), 3.8), squeeze=False)
    lines = []
    for ax, env in zip(axes[0], envs, strict=True):
        for i, variant in enumerate(variants):
            seeds = runs.get(env, {}).get(variant, [])
            for role, ls in (("action", "-"), ("reasoning", ":")):
                pooled: dict[int, list[float]] = {}
                for xs, ys in (_diag_series(rows, f"diag/corr_{role}") for rows in seeds):
                    for x, y in zip(xs, ys, strict=True):
                        pooled.setdefault(x, []).append(y)
                if pooled:
                    xs = sorted(pooled)
                    ax.plot(
                        xs, [statistics.mean(pooled[x]) for x in xs], ls,
                        color=colors[i % len(colors)], label=f"{variant} {role}",
                    )  # fmt: skip
            rows = [r for rows in seeds for r in rows if "diag/share_action" in r]
            if rows:
                ca, cr, sh = (
                    [v for r in rows if (v := r.get(k)) is not None and not math.isnan(v)]
                    for k in ("diag/corr_action", "diag/corr_reasoning", "diag/share_action")
                )
                lines.append(
                    f"| {env} | {variant} | {_mean_std(ca)} | {_mean_std(cr)} | {_mean_std(sh)} |"
                )
        ax.set_title(f"{env}: |corr(Σ log π, return)|")
        ax.set_xlabel("RL iteration")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    png = _save(fig, axes[0][-1], path, fontsize=6)
    if not lines:
        return png, ""
    return png, (
        "| env | variant | action abs corr | reasoning abs corr | action token share |\n"
        "|---|---|---|---|---|\n" + "\n".join(lines)
    )


def final_diagnostic(run_dir: Path, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The action-bottleneck diagnostic of a run's final agent: what ``tokenergy diagnose
    --now`` measured (``report/diagnose_now.json``) when it did, else the last ``diag/*`` row
    the run logged, else ``None``."""
    now = run_dir / "report" / "diagnose_now.json"
    if now.is_file():
        return json.loads(now.read_text())
    diag = [r for r in rows if "diag/share_action" in r]
    return diag[-1] if diag else None


def _energy_diagnostic_section(runs, dirs, envs, variants) -> str:
    """The ActFocus paper's diagnostic per env: the SFT start (the SFT runs' agents) and each
    variant's final agents, Spearman's rho of the groups' return std against their mean
    energy over action, reasoning and all tokens (mean ± std over seeds, seeds with p < 0.05),
    and the action tokens' share."""

    def cell(diags: list[dict[str, Any]], part: str) -> str:
        rhos = [d.get(f"diag/energy_spearman_{part}") for d in diags]
        ps = [d.get(f"diag/energy_p_{part}") for d in diags]
        # a rho that could not be taken is NaN, or null once written to metrics.jsonl
        kept = [
            (r, p) for r, p in zip(rhos, ps, strict=True) if r is not None and not math.isnan(r)
        ]
        if not kept:
            return "—"
        mean = statistics.mean(r for r, _ in kept)
        sd = statistics.stdev([r for r, _ in kept]) if len(kept) > 1 else 0.0
        return f"{mean:+.3f} ± {sd:.3f} ({sum(p < 0.05 for _, p in kept)}/{len(kept)})"

    lines = []
    for env in envs:
        for variant in ["sft", *variants]:
            pairs = zip(
                runs.get(env, {}).get(variant, []), dirs.get(env, {}).get(variant, []), strict=True
            )
            diags = [
                d
                for rows, run_dir in pairs
                if (d := final_diagnostic(run_dir, rows)) is not None
                and "diag/energy_spearman_action" in d
            ]
            if not diags:
                continue
            groups = sorted({int(d.get("diag/energy_groups", 0)) for d in diags})
            share = statistics.mean(d["diag/share_action"] for d in diags)
            label = "SFT start" if variant == "sft" else variant
            lines.append(
                f"| {env} | {label} | {len(diags)} | {'/'.join(map(str, groups))} | "
                f"{cell(diags, 'action')} | {cell(diags, 'reasoning')} | {cell(diags, 'all')} "
                f"| {share:.3f} |"
            )
    if not lines:
        return ""
    return (
        "| env | agents | seeds | groups | rho, action tokens | rho, reasoning tokens "
        "| rho, all tokens | action token share |\n|---|---|---|---|---|---|---|---|\n"
        + "\n".join(lines)
    )


def _weight_section(root: Path, runs, envs, variants) -> str:
    """Where the gradient weight went: the share on action tokens, the largest token weight,
    and the typical action token's weight (from the trajectories the runs kept)."""
    lines = []
    for env in envs:
        for variant in variants:
            rows = [r for seed in runs.get(env, {}).get(variant, []) for r in seed]
            share = [r["weights/action_share"] for r in rows if "weights/action_share" in r]
            wmax = [r["weights/max"] for r in rows if "weights/max" in r]
            typical = [
                w
                for d in sorted((root / env / variant).glob("seed_*"))
                for s in read_samples(d)
                for w, role in zip(s.get("weight", []), s["roles"], strict=False)
                if role == int(Role.ACTION)
            ]
            if share:
                lines.append(
                    f"| {env} | {variant} | {statistics.mean(share):.3f} | "
                    f"{statistics.median(wmax):.1f} | {max(wmax):.1f} | "
                    + (f"{statistics.median(typical):.2f} |" if typical else "— |")
                )
    if not lines:
        return ""
    return (
        "| env | variant | share of loss weight on action tokens | largest token weight "
        "(median over iterations) | (max) | median action-token weight |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(lines)
    )


def markdown_page(text: str, folder: Path, title: str) -> str:
    """The report's markdown as a self-contained HTML page: headings, paragraphs, tables, list
    items (a ``- label: `page.html``` item a link to that page of the study), and images read
    from ``folder`` and embedded, so the page shows every section the markdown has. Inline code
    and emphasis stay as written."""
    body: list[str] = []
    table: list[list[str]] = []
    image = re.compile(r"!\[([^\]]*)\]\(([^)]+)\)")
    page_link = re.compile(r"- (.+): `([^`]+\.html)`")

    def flush_table() -> None:
        if table:
            head, *rows = table
            body.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head)
                        + "</tr>" + "".join("<tr>" + "".join(
                            f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
                        + "</table>")  # fmt: skip
            table.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):  # not the separator row
                table.append(cells)
            continue
        flush_table()
        if not line.strip():
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line[level:].strip())}</h{level}>")
        elif m := image.fullmatch(line.strip()):
            alt, src = m.groups()
            if (folder / src).is_file():
                body.append(f"<img src='data:image/png;base64,{_img(folder / src)}' "
                            f"alt='{html.escape(alt)}'>")  # fmt: skip
        elif m := page_link.fullmatch(line):  # a page of the study: a link to it
            label, href = m.groups()
            body.append(f"<li><a href='../{html.escape(href)}'>{html.escape(label)}</a></li>")
        elif line.startswith("- "):
            body.append(f"<li>{html.escape(line[2:])}</li>")
        else:
            body.append(f"<p>{html.escape(line)}</p>")
    flush_table()
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body>" + "\n".join(body) + "</body></html>"
    )

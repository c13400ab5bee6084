"""Reports from run folders: steps-to-threshold, summaries over seeds, written files."""

import base64
import json
import math

import pytest

from tokenergy.reports.runs import (
    final_value,
    load_ablation,
    steps_to_threshold,
    summarize,
    write_report,
)
from tokenergy.runs import RunDirError


def rows(successes, returns=None, step=100):
    returns = returns or [0.0] * len(successes)
    return [
        {"train/global_step": step * (i + 1), "rollout/success": s, "rollout/return": r}
        for i, (s, r) in enumerate(zip(successes, returns, strict=True))
    ]


def test_steps_to_threshold_and_final_value():
    r = rows([0.0, 0.5, 0.95, 0.8, 1.0], [1, 2, 3, 4, 5])
    assert steps_to_threshold(r, "rollout/success", 0.9) == 300
    assert steps_to_threshold(r, "rollout/success", 1.1) is None
    assert steps_to_threshold([{"train/global_step": 5}], "rollout/success", 0.0) is None
    assert final_value(r, "rollout/return", frac=0.4) == pytest.approx(4.5)
    assert final_value(r, "rollout/return", frac=0.01) == 5.0
    assert math.isnan(final_value(r, "missing"))


def test_summarize_over_seeds():
    runs = {
        "ppo": [rows([0, 1, 1]), rows([0, 0, 1])],  # solved at 200 and 300
        "energy": [rows([1, 1, 1]), rows([0, 0, 0])],  # solved at 100, never
    }
    ppo, energy = summarize(runs, "rollout/success", 0.9)
    assert (ppo.solved, ppo.steps_mean, ppo.steps_std) == (2, 250.0, 50.0)
    assert (energy.solved, energy.steps_mean, energy.steps) == (1, 100.0, [100, None])


def _write(run_dir, metric_rows):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in metric_rows) + '{"trunc'
    )


def test_write_report_for_an_ablation_folder(tmp_path):
    for variant, seqs in {"ppo": [[0, 1, 1], [0, 0, 1]], "energy": [[0, 1, 1], [1, 1, 1]]}.items():
        for k, s in enumerate(seqs):
            _write(tmp_path / variant / f"seed_{k}", rows(s, [0.1 * i for i in range(len(s))]))
    (tmp_path / "ablation.yaml").write_text("variants: [ppo, energy]\n")
    runs = load_ablation(tmp_path)
    assert list(runs) == ["ppo", "energy"]  # the ablation's order, not alphabetical
    assert len(runs["ppo"][0]) == 3  # the truncated last line (a crash mid-write) is skipped
    folder, table = write_report(tmp_path, "rollout/success", 0.9)
    assert "| ppo | 2/2 | 250 ± 50 | — |" in table
    assert "| energy | 2/2 | 150 ± 50 | -40.0% |" in table
    assert (folder / "curves.png").stat().st_size > 1000
    assert "data:image/png;base64," in (folder / "report.html").read_text()


def test_report_plots_an_evaluation_logged_every_other_iteration(tmp_path):
    from tokenergy.reports.runs import _curve, step_label

    logged = rows([0.1, 0.2, 0.3, 0.4])
    for i, r in enumerate(logged):
        if i % 2 == 1:
            r["eval/success"] = 0.5 * i
    steps, values = _curve(logged, "eval/success")
    assert steps.tolist() == [200.0, 400.0] and values.tolist() == [0.5, 1.5]
    steps, values = _curve(logged, "rollout/success")  # a dense metric keeps every row
    assert steps.tolist() == [100.0, 200.0, 300.0, 400.0]
    assert step_label({"ppo": [logged]}) == "environment steps"
    lm_rows = [{"train/global_step": 0, "eval/success": 0.1}, {**logged[0], "train/episodes": 16}]
    assert step_label({"ppo": [lm_rows]}) == "training episodes"  # not only its first row
    for k in range(2):
        _write(tmp_path / "ppo" / f"seed_{k}", logged)
    folder, _ = write_report(tmp_path, "rollout/success", 0.9, panels=["eval/success"])
    assert (folder / "curves.png").stat().st_size > 1000
    with pytest.raises(RunDirError, match="no run logged eval/state_exact"):
        write_report(tmp_path, "rollout/success", 0.9, panels=["eval/state_exact"])


def test_report_errors_name_the_path(tmp_path):
    with pytest.raises(RunDirError, match="is not a folder"):
        load_ablation(tmp_path / "missing")
    with pytest.raises(RunDirError, match=r"neither metrics\.jsonl"):
        load_ablation(tmp_path)


def test_markdown_page_carries_every_section_of_the_report(tmp_path):
    """Headings, paragraphs, tables (without the separator row), embedded images and the links
    to the token pages: what the markdown report says, the HTML page shows."""
    from tokenergy.reports.lm import markdown_page

    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
    (tmp_path / "curves.png").write_bytes(png)
    text = (
        "# LM ablation: demo\n\nFinal-step success <b>.\n\n| variant | sokoban |\n|---|---|\n"
        "| ppo | 0.45 ± 0.02 |\n\nPeak-to-final drop:\n\n| variant | sokoban |\n|---|---|\n"
        "| ppo | +0.01 |\n\n![success curves](curves.png)\n![gone](missing.png)\n\n"
        "- sokoban / ppo: `sokoban/ppo/seed_0/report/tokens.html`\n- a plain item\n"
    )
    page = markdown_page(text, tmp_path, "demo")
    assert "<h1>LM ablation: demo</h1>" in page
    assert "<p>Final-step success &lt;b&gt;.</p>" in page and "<p>Peak-to-final drop:</p>" in page
    assert page.count("<table>") == 2 and "---" not in page
    assert (
        "<tr><th>variant</th><th>sokoban</th></tr><tr><td>ppo</td><td>0.45 ± 0.02</td></tr>" in page
    )
    assert page.count("<img ") == 1  # the missing picture is left out
    assert "data:image/png;base64," + base64.b64encode(png).decode() in page
    assert "<a href='../sokoban/ppo/seed_0/report/tokens.html'>sokoban / ppo</a>" in page
    assert "<li>a plain item</li>" in page

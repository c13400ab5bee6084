"""The numbers of short fixed-seed runs of every trainer (vector PPO, LM PPO and GRPO,
ActFocus-PPO, the SFT -> RM -> PPO pipeline, DFS learning) stay those of the golden files:
moving code must not move results. The tolerance covers rounding; the runs sample tokens and
moves, and on another kind of CPU a rounding difference can flip a sampled token and part the
runs, so the golden files are checked on the CPU model that wrote them (``tests/golden/cpu.txt``)
and skipped elsewhere; ``benchmarks/same_numbers.py --baseline`` compares two checkouts on any
machine."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from same_numbers import CASES, GOLDEN, cpu_model, first_difference, numbers, run_case


@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_give_the_golden_numbers(name):
    written_on = (GOLDEN / "cpu.txt").read_text().strip()
    if cpu_model() != written_on:
        pytest.skip(f"golden numbers from {written_on!r}; this CPU is {cpu_model()!r}")
    golden = [json.loads(x) for x in (GOLDEN / f"{name}.jsonl").read_text().splitlines()]
    assert golden and any(len(r) > 3 for r in golden)  # the file holds learning metrics
    assert first_difference(run_case(name), golden, rtol=1e-3, atol=1e-5) == ""


def test_first_difference_finds_a_changed_value_a_missing_key_and_a_missing_row():
    a = numbers([{"x": 1.0, "n": 2, "perf/sps": 9.0}, {"x": 2.0, "n": 3}])
    assert a == [{"x": 1.0, "n": 2}, {"x": 2.0, "n": 3}]
    assert first_difference(a, [dict(r) for r in a]) == ""
    assert first_difference(a, [{"x": 1.0, "n": 2}, {"x": 2.0001, "n": 3}]) == (
        "row 1: x 2.0 against 2.0001"
    )
    assert first_difference(a, [{"x": 1.0, "n": 2}, {"x": 2.0001, "n": 3}], rtol=1e-3) == ""
    assert (
        first_difference(a, [{"x": 1.0}, {"x": 2.0, "n": 3}]) == "row 0: keys ['n'] in one run only"
    )
    assert first_difference(a, a[:1]) == "2 rows against 1"
    assert first_difference(a, [{"x": 1.0, "n": 5}, a[1]]) == "row 0: n 2 against 5"

"""Shared helpers of the benchmark scripts: machine description and RESULTS.md appends."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def machine() -> str:
    import gymnasium
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} logical cores; Python {platform.python_version()}, "
        f"torch {torch.__version__}, gymnasium {gymnasium.__version__}"
    )


def command() -> str:
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


def append_results(title: str, body: str) -> None:
    """Append one dated section (title, command, machine, body) to benchmarks/RESULTS.md."""
    if not RESULTS.exists():
        RESULTS.write_text(
            "# Benchmark results\n\nEach section is appended by the script named in it.\n"
        )
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    with RESULTS.open("a") as f:
        f.write(
            f"\n## {title} ({stamp})\n\n- command: `{command()}`\n- machine: {machine()}\n\n{body}\n"
        )
    print(f"appended to {RESULTS}")

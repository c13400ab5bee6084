"""Ablation processes: the pool's workers end with the process that started them."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive (a zombie left for a parent that never reaps counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_pool_workers_exit_when_the_ablation_process_is_killed(tmp_path):
    """A worker of `tokenergy ablate --jobs N` whose parent is killed by a signal stops within
    seconds instead of training on as an orphan."""
    pid_file = tmp_path / "worker.pid"
    script = tmp_path / "ablation.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import concurrent.futures as cf, multiprocessing as mp, os, time
            from tokenergy.experiments import _init_pool_worker

            def long_run(path):
                open(path, "w").write(str(os.getpid()))
                time.sleep(120)

            if __name__ == "__main__":
                ctx = mp.get_context("spawn")
                init = (ctx.Queue(), os.getpid())
                with cf.ProcessPoolExecutor(1, ctx, initializer=_init_pool_worker,
                                            initargs=init) as pool:
                    pool.submit(long_run, {str(pid_file)!r}).result()
            """
        )
    )
    parent = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline and parent.poll() is None, "the worker never started"
        time.sleep(0.1)
    worker = int(pid_file.read_text())
    assert _running(worker)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    ended = not _running(worker)
    if not ended:
        os.kill(worker, signal.SIGKILL)
    assert ended, "the pool worker kept running after its parent was killed"

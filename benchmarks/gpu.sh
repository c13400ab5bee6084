#!/usr/bin/env bash
# The LM benchmarks on a CUDA machine, in one go; each script appends its table to
# benchmarks/RESULTS.md (commit that file afterwards). Run from anywhere:
#
#   bash benchmarks/gpu.sh            # creates .venv (PyPI's torch 2.13.0 is the CUDA build)
#   PY=/path/to/python bash benchmarks/gpu.sh
#
# About 15 minutes on one recent GPU. Steps: a CUDA check, one RL iteration of the paper's
# size split into rollout / scoring / update (tiny and small, Sokoban), rollout and update
# throughput per model size, the update's scaling with length / batch / size against the measured
# matmul roofline, the ActFocus overhead, and GRPO against TRL's GRPOTrainer.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PY:-}" ]]; then
  test -x .venv/bin/python || python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
  PY=.venv/bin/python
fi
"$PY" - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"no CUDA device visible to torch {torch.__version__}; this script measures GPUs")
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PYEOF
"$PY" benchmarks/rl_iteration.py --device cuda --threads 4 --envs sokoban --sizes tiny small
"$PY" benchmarks/lm_throughput.py --device cuda --threads 4 --repeats 3 --episodes 64
"$PY" benchmarks/lm_scaling.py --device cuda --threads 4 --lengths 256 512 1024 --batches 16 32 64
"$PY" benchmarks/actfocus_overhead.py --device cuda --threads 4 --size small
"$PY" benchmarks/trl_grpo.py --device cuda --threads 4 --model small

#!/usr/bin/env bash
# Creates .venv with the CPU torch pin first, then the package with its experiment, RL, test, HF and gpu (triton) extras.
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

pip_install() {
  # pip's "Location ... is ignored" warnings about this machine's local indexes are noise; failures are not.
  .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "is ignored" || true; }
  return "${PIPESTATUS[0]}"
}

[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip_install torch==2.13.0
# gpu = triton: on a CPU machine it runs the Triton kernels' check in Triton's interpreter (tests/test_triton_kernel.py)
pip_install -c constraints.txt -e '.[experiments,rl,dev,hf,gpu]'
.venv/bin/python -c "import torch, primal_attention; print('setup ok: torch', torch.__version__)"

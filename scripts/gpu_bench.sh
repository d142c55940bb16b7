#!/usr/bin/env bash
# The GPU numbers of docs/results/efficiency.md, on one CUDA device, in under 5 minutes.
#
#   bash scripts/gpu_bench.sh [OUT_DIR]        (default bench_results/gpu)
#
# First checks the Triton kernels against the PyTorch path on the device (tests/test_triton_kernel.py;
# skipped without triton). Needs a CUDA build of torch in .venv (scripts/setup.sh installs the CPU pin; on a GPU machine
# install the matching CUDA wheel of torch 2.13.0 first). It runs the harness with `--preset gpu`
# (layer, training step and inference; N 256-65 536; fp32 and bf16; eager; timings synchronised,
# memory = torch.cuda.max_memory_allocated), then re-renders the efficiency page with the GPU
# section filled from the JSON it wrote. Commit docs/results/efficiency.md and OUT_DIR/results.json.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench_results/gpu}"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python
"$PY" - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"scripts/gpu_bench.sh: torch {torch.__version__} sees no CUDA device; install a CUDA build of torch")
print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
PYEOF
# The Triton kernels of the folded path against the PyTorch path on the device (values, gradients).
"$PY" -m pytest -q -p no:cacheprovider tests/test_triton_kernel.py
timeout 290 "$PY" -m primal_attention.cli bench --preset gpu --device cuda --out "$OUT"
"$PY" -m primal_attention.cli bench --from-json docs/results/efficiency/results.json --gpu-json "$OUT/results.json" \
    --out docs/results/efficiency --doc docs/results/efficiency.md
echo "GPU section written: docs/results/efficiency.md (from $OUT/results.json)"

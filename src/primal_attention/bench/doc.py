"""docs/results/efficiency.md from a CPU run (and, once one exists, a GPU run)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from primal_attention.bench.analysis import analyse
from primal_attention.bench.plots import plot
from primal_attention.bench.tables import markdown

DOC_COMMAND = "primal bench --out docs/results/efficiency --doc docs/results/efficiency.md"
GPU_COMMAND = "scripts/gpu_bench.sh"

INTRO = """\
# Efficiency: Primal-Attention against fused softmax and other efficient attentions

Generated from `{json}` by the command in the CPU section's *Run* list; do not edit by hand. The full
grid (N up to 65 536, fp32 and bf16, eager and `torch.compile`) is `{command}`; `primal bench --quick`
is the 3-minute version (training step only). The GPU section is filled from
the JSON that `{gpu_command}` writes on a CUDA machine (`primal bench --from-json docs/results/efficiency/results.json
--gpu-json <gpu results.json> --doc docs/results/efficiency.md` re-renders this page with it).

What is measured (`primal_attention.bench`):

- **levels**: `train` — the LRA ListOps model (D 64, H 2, 2 pre-norm layers, MLP 128, mean pooling,
  dropout 0.1; primal s 20, n 200, η 0.1) as one training step: forward, cross-entropy + η·KSVD loss,
  backward, AdamW step; `layer` — the attention layer alone, forward + backward of mean(out²) (+ η·J²
  for primal); `infer` — the model's forward under `no_grad`. No padding (mask None).
- **methods**: primal (fast path, `primal_attention.ops.primal.fused`), primal (reference: the readable math of
  `primal_attention.ops.primal.reference`), softmax via fused SDPA, softmax with the N×N matrix, and the paper's
  Table 3 baselines: Nyström (64 landmarks), Linformer (k 256), Performer (256 features), Reformer
  (2 hashes), linear attention (elu+1); and, where the run was given an export of the authors'
  repository (`--authors-repo`), the authors' own PrimalFormer (`authors`: their attention and LRA model
  modules unchanged, same s, n, η and dropout), for side-by-side ratios against their code.
- **timing**: all methods of one (level, dtype, mode, N) are built side by side and timed in interleaved
  rounds after a warm-up (median over the rounds; quartiles in the JSON), so each ratio compares calls made
  under the same load. Methods stop gracefully at the time or memory budget (forecast from the previous
  lengths on the log-log line, or measured) and are marked.
- **reading the ratios**: in the `train` and `infer` rows every method shares the same non-attention
  work (embedding, FFN, LayerNorm, dropout, pooling head, AdamW), which bounds a model-level speed-up
  however fast the attention is; the `layer` rows compare the attentions alone.
- **memory**: {memory_method}.
- **FLOPs / bytes**: counted per ATen operator over one call (matmuls and attention kernels; bytes =
  inputs + outputs of each non-view operator). Limits: a square GEMM and a 256 MiB copy, measured in the
  same run.
"""

GPU_PLACEHOLDER = """\
## GPU

To be filled by `{gpu_command}` on a CUDA machine (it runs the same harness with `--preset gpu`: one
device, under 5 minutes, and writes the same tables; it first checks the Triton kernels of the folded
path against the PyTorch path on the device). No GPU was available to us, and no GPU number on
this page is estimated or copied: the section stays empty until a real run exists.
"""


def write_doc(
    cpu: dict[str, Any],
    doc_path: Path,
    *,
    json_path: Path,
    plots_dir: Path,
    gpu: dict[str, Any] | None = None,
    command: str = DOC_COMMAND,
) -> Path:
    """Write the efficiency page; plots go to plots_dir and are linked relative to the page."""
    doc_path = Path(doc_path)
    doc_path.parent.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(plots_dir, doc_path.parent))
    cpu_plots = {k: str(rel / v) for k, v in plot(cpu, Path(plots_dir)).items()}
    method = next((r["memory_method"] for r in cpu["records"] if r.get("memory_method")), "not measured")
    parts = [
        INTRO.format(command=command, json=os.path.relpath(json_path, doc_path.parent), gpu_command=GPU_COMMAND,
                     memory_method=method),
        "## CPU\n",
        markdown(cpu, analyse(cpu), plots=cpu_plots, heading_level=3),
    ]
    if gpu is None:
        parts.append(GPU_PLACEHOLDER.format(gpu_command=GPU_COMMAND))
    else:
        gpu_plots = {k: str(rel / v) for k, v in plot(gpu, Path(plots_dir), prefix="gpu_").items()}
        parts += ["## GPU\n", markdown(gpu, analyse(gpu), plots=gpu_plots, heading_level=3)]
    doc_path.write_text("\n".join(parts))
    return doc_path

"""Load the authors' reference vectors into our layer and check that we reproduce them.

The five published cases ship with the package (``reference_vectors/``); more cases in the same
format can be checked from any directory. Array names follow the README beside the files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from primal_attention.layers.primal import PrimalAttention
from primal_attention.ksvd.terms import ksvd_terms

BUNDLED = Path(__file__).resolve().parent / "reference_vectors"

PARAMETER_ARRAYS = {
    "q_proj.weight": "q_weight",
    "q_proj.bias": "q_bias",
    "k_proj.weight": "k_weight",
    "k_proj.bias": "k_bias",
    "we": "we",
    "wr": "wr",
    "lam": "lam",
    "mix.weight": "mix_weight",
    "mix.bias": "mix_bias",
    "out_proj.weight": "out_weight",
    "out_proj.bias": "out_bias",
}


def reference_files(*dirs: Path) -> list[Path]:
    """The bundled cases plus every ``*.npz`` in ``dirs`` (a later file of the same name wins)."""
    found: dict[str, Path] = {}
    for d in (BUNDLED, *dirs):
        if d.is_dir():
            for f in sorted(d.glob("*.npz")):
                found[f.name] = f
    return [found[k] for k in sorted(found)]


def load_reference(path: Path, dtype: torch.dtype = torch.float32) -> tuple[PrimalAttention, dict[str, np.ndarray]]:
    """Our layer carrying a reference file's weights, and the file's arrays."""
    try:
        with np.load(path, allow_pickle=False) as z:
            d = dict(z)
        missing = [k for k in ("x", "kind", "heads", "rank", "out") if k not in d]
        if missing:
            raise ValueError(f"no {', '.join(missing)}")
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"{path} is not a reference-vector .npz ({err})") from None
    causal = str(d["kind"]) == "causal"
    layer = PrimalAttention(
        d["x"].shape[-1],
        int(d["heads"]),
        int(d["rank"]),
        causal=causal,
        num_samples=None if causal else int(d["num_samples"]),
    )
    layer.load_state_dict({ours: torch.tensor(d[theirs]) for ours, theirs in PARAMETER_ARRAYS.items()})
    return layer.to(dtype), d


@dataclass
class CaseResult:
    """Worst relative error of each checked quantity against a reference file."""

    name: str
    errors: dict[str, float]

    def passed(self, tol: float = 1e-5) -> bool:
        return all(e <= tol for e in self.errors.values())


def _relerr(ours: torch.Tensor, theirs: np.ndarray, atol: float = 1e-6) -> float:
    """max |a - b| / (atol + |b|): ≤ rtol exactly when ``allclose(rtol, atol)`` would pass."""
    b = torch.tensor(theirs, dtype=torch.float64)
    return float(((ours.detach().double() - b).abs() / (atol / 1e-5 + b.abs())).max()) if b.numel() else 0.0


def check_case(path: Path, impl: str = "fast") -> CaseResult:
    """Run one reference case through our layer (float32, as the authors did) with ``impl``."""
    layer, d = load_reference(path)
    layer.impl = impl
    x = torch.tensor(d["x"], dtype=torch.float32, requires_grad=True)
    mask = torch.tensor(d["mask"]).bool() if "mask" in d else None
    with ksvd_terms(layer) as terms:
        out = layer(x, mask)
    j_batch = terms.objective("batch")
    errors = {
        "out": _relerr(out, d["out"]),
        "ksvd_j_batch": _relerr(j_batch, d["ksvd_j_batch"]),
        "ksvd_j_sample": _relerr(terms.objective("sample"), d["ksvd_j_sample"]),
    }
    if "grad_x_of_sum_out_plus_j2" in d:
        (grad,) = torch.autograd.grad(out.sum() + j_batch**2, x)
        errors["grad_x"] = _relerr(grad, d["grad_x_of_sum_out_plus_j2"])
    return CaseResult(path.stem, errors)

"""`pip install primal-attention` with torch alone (no extras): the package imports, and the layer, the
KSVD loss and O(1) decoding run. Built for real: a fresh virtual environment with only the CPU torch pin
and this package (no numpy, no PyYAML), kept under the user cache so a second run only reinstalls the
package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "primal-attention" / "venvs"

SMOKE = textwrap.dedent("""
    import importlib.util, sys
    import torch
    import primal_attention as pa
    for name in ("numpy", "yaml", "safetensors", "tqdm"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed: not a torch-only environment"
    attn = pa.PrimalAttention(16, 2, rank=3)
    x = torch.randn(2, 10, 16)
    mask = torch.arange(10)[None] < torch.tensor([[10], [6]])
    with pa.ksvd_terms(attn) as terms:
        y = attn(x, mask)
    loss = y.square().mean() + 0.1 * terms.loss()
    loss.backward()
    causal = pa.PrimalAttention(16, 2, rank=3, causal=True).eval()
    state = None
    for t in range(4):
        out, state = causal.step(x[:, t], state)
    torch.testing.assert_close(out, causal(x[:, :4])[:, 3], rtol=1e-5, atol=1e-6)
    model = pa.SequenceClassifier(pa.ClassifierConfig(num_classes=3, max_seq_len=10, vocab_size=7, dim=16, num_heads=2,
                                                     ffn_dim=32, attention=["softmax", "primal"]))
    model(torch.randint(0, 7, (2, 10)), mask).sum().backward()
    print("torch-only ok", torch.__version__)
""")


def _venv() -> Path:
    """A cached venv with the torch pin only (the package is reinstalled every time)."""
    env = CACHE / f"torch-only-{torch.__version__.split('+')[0]}-py{sys.version_info.major}{sys.version_info.minor}"
    python = env / "bin" / "python"
    if python.is_file():
        listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True)
        if listed.returncode == 0 and "numpy" not in listed.stdout.lower():
            return env
        shutil.rmtree(env)
    env.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    pin = torch.__version__.split("+")[0]
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"torch=={pin}"],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        shutil.rmtree(env, ignore_errors=True)
        pytest.fail(f"could not install torch=={pin} into a fresh venv: {done.stderr[-2000:]}")
    return env


@pytest.mark.slow
def test_a_torch_only_install_imports_and_runs(tmp_path) -> None:
    env = _venv()
    python = env / "bin" / "python"
    # a copy of the tree without build outputs, installed without dependencies: torch is already there
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "runs", "docs", "*.egg-info", "__pycache__"))
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-build-isolation",
                           "--force-reinstall", str(src)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    run = subprocess.run([str(python), "-c", SMOKE], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "torch-only ok" in run.stdout

"""The Python blocks of docs/hf.md run as written, in order, sharing one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

DOC = Path(__file__).resolve().parents[2] / "docs" / "hf.md"


def test_hf_doc_examples_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)  # the Trainer example writes its output_dir here
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    assert "ksvd_loss" in namespace["trainer"].state.log_history[-2]
    assert type(namespace["out"].cache.layers[1]).__name__ == "PrimalCacheLayer"

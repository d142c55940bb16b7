"""The Python blocks of docs/convert.md run as written, in order, sharing one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

DOC = Path(__file__).resolve().parents[2] / "docs" / "convert.md"


def test_convert_doc_examples_run(tmp_path, monkeypatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)  # the example writes gpt2_primal/ here
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    assert namespace["report"]["finished"] and namespace["out"].shape == (1, 9)

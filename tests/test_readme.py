"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples() -> None:
    assert python_blocks()


def test_readme_python_examples_run() -> None:
    for block in python_blocks():
        exec(compile(block, str(README), "exec"), {})


def test_readme_names_the_ci_test_command() -> None:
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in text and "bash scripts/test.sh" in ci

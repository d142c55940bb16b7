"""Shared fixtures: the authors' reference vectors (bundled, plus any held-out ones beside the repo)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from primal_attention.checks import reference_files

ROOT = Path(__file__).resolve().parents[1]
EXTRA_REFERENCE_DIRS = [ROOT.parent / "shared" / "reference"] + (
    [Path(os.environ["PRIMAL_REFERENCE_DIR"])] if os.environ.get("PRIMAL_REFERENCE_DIR") else []
)


def all_reference_files() -> list[Path]:
    return reference_files(*EXTRA_REFERENCE_DIRS)


@pytest.fixture(params=all_reference_files(), ids=lambda p: p.stem)
def reference_case(request: pytest.FixtureRequest) -> Path:
    return request.param

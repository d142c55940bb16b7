"""Where the studies read and write: the checkout of the repository they belong to.

A study reads ``configs/`` and writes ``docs/results/`` of the repository, so it runs from a checkout
(the editable install of ``scripts/setup.sh``). ``ROOT`` is the checkout that holds this package, or
else the current directory when that is one (a study then fails on its first missing file).
"""

from __future__ import annotations

from pathlib import Path


def _checkout() -> Path:
    def is_checkout(path: Path) -> bool:
        return (path / "configs").is_dir() and (path / "docs" / "results").is_dir()

    here = Path(__file__).resolve().parents[3]  # src/primal_attention/studies/paths.py -> the repository
    return here if is_checkout(here) or not is_checkout(Path.cwd()) else Path.cwd().resolve()


ROOT = _checkout()

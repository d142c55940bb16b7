"""Where fetched and prepared datasets live: never inside the repository."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$PRIMAL_ATTENTION_CACHE`` (default ``~/.cache/primal-attention``) joined with ``parts``, created."""
    root = Path(os.environ.get("PRIMAL_ATTENTION_CACHE", Path.home() / ".cache" / "primal-attention"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path

"""Where fetched and prepared datasets live: never inside the repository."""

from __future__ import annotations

import os
from pathlib import Path

from primal_attention.data.base import DataError


def cache_dir(*parts: str) -> Path:
    """``$PRIMAL_ATTENTION_CACHE`` (default ``~/.cache/primal-attention``) joined with ``parts``, created;
    DataError when it cannot be."""
    root = Path(os.environ.get("PRIMAL_ATTENTION_CACHE", Path.home() / ".cache" / "primal-attention"))
    path = root.joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # e.g. the variable names a file, or a folder without write permission
        raise DataError(f"cannot use the cache folder {path} ({err.strerror or err}); set PRIMAL_ATTENTION_CACHE "
                        "to a writable folder") from err
    return path

"""Where fetched and prepared datasets live: never inside the repository."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the cache's ``.locks/<name>.lock`` while the block runs, waiting for
    any other process that holds it (the lock lives outside the folder it guards, so a failed fill can
    still remove its empty folder): two runs that fill the same cache folder at once (two sweep workers starting on one
    dataset) take turns, and the second finds the first's result instead of replacing the folder under
    the first's reader. The kernel releases the lock when its holder exits, however it exits. Without
    POSIX ``fcntl`` (Windows) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(cache_dir(".locks") / f"{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

"""What the LRA task modules share: split names and checks, example counts and seeded subsets, byte and
pixel tokenisation, the :class:`SequenceData` constructor, and the ``.npz`` cache under
``cache_dir("lra", <family>)``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from primal_attention.data.base import SequenceData
from primal_attention.data.cache import cache_dir

__all__ = [
    "SPLITS",
    "VAL_SEED",
    "check_split",
    "check_fixed_seq_len",
    "to_data",
    "example_count",
    "random_subset",
    "encode_bytes",
    "pixels_to_tokens",
    "cache_path",
    "save_npz",
    "load_npz",
    "file_key",
]

SPLITS = ("train", "val", "test")

VAL_SEED = 20210101
"""Fixed seed of carved validation sets and fixed splits: they must not move with ``seed``."""


def check_split(split: str) -> None:
    """Raise ``ValueError`` unless ``split`` is one of :data:`SPLITS`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def check_fixed_seq_len(task: str, data: SequenceData, seq_len: int | None) -> SequenceData:
    """``data`` of an image task (its length is the flattened image), or ``ValueError`` when a
    ``seq_len`` other than that length was asked for."""
    if seq_len is not None and seq_len != data.seq_len:
        raise ValueError(f"LRA {task} sequences are the flattened image ({data.seq_len} tokens), "
                         f"got seq_len={seq_len}")
    return data


def to_data(x: np.ndarray, mask: np.ndarray, y: np.ndarray, *, x2: np.ndarray | None = None,
            mask2: np.ndarray | None = None, **fields) -> SequenceData:
    """:class:`SequenceData` from numpy arrays: ``x``/``x2`` ``(M, L)`` and ``y`` ``(M,)`` as int64,
    ``mask``/``mask2`` ``(M, L)`` as bool; ``fields`` are its other fields (``num_classes`` etc.)."""
    def long(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))

    def flag(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=bool))

    return SequenceData(x=long(x), mask=flag(mask), y=long(y), x2=None if x2 is None else long(x2),
                        mask2=None if mask2 is None else flag(mask2), **fields)


def example_count(split: str, num_examples: int | None, defaults: dict[str, int]) -> int:
    """How many examples to generate for ``split``: ``num_examples``, or ``defaults[split]`` when None."""
    n = defaults[split] if num_examples is None else num_examples
    if n < 0:
        raise ValueError(f"num_examples must be >= 0, got {n}")
    return n


def random_subset(n: int, num_examples: int | None, seed: int) -> np.ndarray | None:
    """Sorted indices of a seeded random subset of ``num_examples`` of ``n``; None for all of them
    (also when ``num_examples >= n``: a real set gives at most what it has)."""
    if num_examples is None or num_examples >= n:
        return None
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    return np.sort(np.random.default_rng(seed).choice(n, size=num_examples, replace=False))


def encode_bytes(docs: Sequence[bytes], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Byte-level tokens (byte + 1; 0 = padding), truncated or padded to ``seq_len``.

    Returns ``x`` ``(M, seq_len)`` int64 and ``mask`` ``(M, seq_len)`` bool.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    x = np.zeros((len(docs), seq_len), np.int64)
    lengths = np.zeros(len(docs), np.int64)
    for i, doc in enumerate(docs):
        b = np.frombuffer(doc[:seq_len], np.uint8)
        x[i, : b.size] = b.astype(np.int64) + 1
        lengths[i] = b.size
    return x, np.arange(seq_len)[None, :] < lengths[:, None]


def pixels_to_tokens(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(M, H, W)`` uint8 grey levels → tokens ``(M, H·W)`` = pixel + 1, and an all-True mask."""
    x = images.reshape(images.shape[0], -1).astype(np.int64) + 1
    return x, np.ones(x.shape, bool)


def cache_path(family: str, params: dict) -> Path:
    """``cache_dir("lra", family) / "<first 20 hex digits of sha256(params as sorted JSON)>.npz"``."""
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir("lra", family) / f"{digest}.npz"


def save_npz(path: Path, params: dict, **arrays: np.ndarray) -> None:
    """Write ``arrays`` and ``params`` (as ``_params``) to ``path`` atomically (a temporary file, then a rename)."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, _params=np.array(json.dumps(params, sort_keys=True)), **arrays)
    tmp.replace(path)


def load_npz(path: Path, params: dict) -> dict[str, np.ndarray] | None:
    """The arrays of a cache file written with the same ``params``, or None (absent or unreadable)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if json.loads(str(z["_params"])) != json.loads(json.dumps(params, sort_keys=True)):
                return None
            return {k: z[k] for k in z.files if k != "_params"}
    except (OSError, ValueError, KeyError, EOFError):
        return None


def file_key(path: Path) -> dict:
    """What identifies a source file in a cache key: its resolved path, size and modification time."""
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}

"""IDX files (the MNIST / Fashion-MNIST format), gzip-compressed.

Layout (big-endian): a 4-byte magic ``0x0000TTNN`` (TT = 0x08 for unsigned bytes, NN = number of
dimensions), NN 4-byte sizes, then the values. Images are magic 2051 (``0x00000803``: N × rows ×
cols), labels 2049 (``0x00000801``: N).
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from primal_attention.data.base import DataError

__all__ = ["read_idx"]


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """The uint8 array stored in the gzip-compressed IDX file ``path``, shaped as its header says.

    Args:
        path: a ``*-idx?-ubyte.gz`` file.
        magic: the magic number expected (2051 for images, 2049 for labels); it fixes the rank.

    Raises:
        DataError: not a readable gzip file, a different magic, a short header, or a value count
            that does not match the header.
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable gzip file ({exc})") from exc
    if len(raw) < 4 or struct.unpack(">I", raw[:4])[0] != magic:
        found = struct.unpack(">I", raw[:4])[0] if len(raw) >= 4 else None
        raise DataError(f"{path}: not an IDX file with magic {magic} (found {found})")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: IDX header needs {header} bytes for {ndim} dimensions, file has {len(raw)}")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    data = np.frombuffer(raw, np.uint8, offset=header)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path}: header says {dims}, found {data.size} values")
    return data.reshape(dims)

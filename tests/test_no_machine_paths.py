"""Committed pages and records name no absolute path of the machine that wrote them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from primal_attention.provenance import shown_command, shown_path

ROOT = Path(__file__).resolve().parents[1]
#: an absolute path under a machine's usual roots, not inside a relative path (``sweeps/x/work/...``)
MACHINE_PATH = re.compile(r"(?:^|[^\w.+/~-])/(?:work|tmp|root|home|Users|private|var/folders)/")


def _committed_text_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "docs", "README.md"], capture_output=True,
                                text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / f for f in listed if f.endswith((".md", ".json", ".csv", ".txt", ".yaml"))]


def test_no_committed_page_or_record_carries_an_absolute_machine_path() -> None:
    files = _committed_text_files()
    assert len(files) > 100
    here = str(ROOT)
    found = []
    for path in files:
        text = path.read_text(errors="replace")
        for line_no, line in enumerate(text.splitlines(), 1):
            if here in line or MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(ROOT)}:{line_no}: {line.strip()[:120]}")
    assert not found, "\n".join(found[:20])


def test_the_pattern_finds_machine_paths_and_spares_relative_ones() -> None:
    assert MACHINE_PATH.search("`/work/main/.venv/bin/python scripts/x.py`")
    assert MACHINE_PATH.search('"checkpoint": "/tmp/run/seed_0"')
    assert not MACHINE_PATH.search("--out runs/sweeps/JapaneseVowels/work/optim.lr=0.001")
    assert not MACHINE_PATH.search("~/.cache/primal-attention/lm")


def test_shown_command_makes_paths_relative_and_names_the_readers_folders(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    argv = [str(tmp_path / ".venv/bin/python"), str(tmp_path / "scripts/run.py"), "--authors-repo", "/elsewhere/authors",
            f"--out={tmp_path / 'docs'}", "--set", "optim.lr=0.1", "two words"]
    assert shown_command(argv) == (".venv/bin/python scripts/run.py --authors-repo $PRIMAL_AUTHORS_REPO --out=docs "
                                   "--set optim.lr=0.1 'two words'")
    assert shown_path(tmp_path / "docs" / "x.md") == "docs/x.md"
    assert shown_path("/elsewhere/file") == "/elsewhere/file"

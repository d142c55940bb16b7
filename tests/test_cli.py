"""`primal` command line, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys


def test_selfcheck_passes_and_writes_json(tmp_path) -> None:
    out = tmp_path / "timing.json"
    proc = subprocess.run(
        [sys.executable, "-m", "primal_attention.cli", "selfcheck", "--seq-len", "256", "--batch", "2",
         "--repeats", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all within rtol 1e-5" in proc.stdout
    data = json.loads(out.read_text())
    assert data["shape"]["N"] == 256 and data["fast"]["median"] > 0 and data["reference"]["median"] > 0


def test_help_lists_commands() -> None:
    proc = subprocess.run([sys.executable, "-m", "primal_attention.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "selfcheck" in proc.stdout


def test_data_fetch_bundled_and_unknown() -> None:
    ok = subprocess.run([sys.executable, "-m", "primal_attention.cli", "data", "fetch", "fsdd"], capture_output=True, text=True)
    assert ok.returncode == 0 and "ready at" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "primal_attention.cli", "data", "fetch", "NoSuchThing"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "NoSuchThing" in bad.stderr and "Traceback" not in bad.stderr

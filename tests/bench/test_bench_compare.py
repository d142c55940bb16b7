"""scripts/bench_compare.py: before / after ratios of `primal bench` runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_compare.py"
from primal_attention.studies import bench_compare  # noqa: E402


def run(folder: Path, times: dict[tuple[str, int], float], failed: tuple[str, int] | None = None) -> Path:
    folder.mkdir()
    records = [{"level": "train", "dtype": "fp32", "mode": "eager", "label": m, "seq_len": n, "status": "ok",
                "time": {"median": t}} for (m, n), t in times.items()]
    if failed:
        records.append({"level": "train", "dtype": "fp32", "mode": "eager", "label": failed[0], "seq_len": failed[1],
                        "status": "oom", "time": None})
    (folder / "results.json").write_text(json.dumps({"records": records}))
    return folder


def test_medians_and_ratios(tmp_path: Path) -> None:
    b1 = run(tmp_path / "b1", {("primal", 256): 0.010, ("softmax", 256): 0.020})
    b2 = run(tmp_path / "b2", {("primal", 256): 0.012, ("softmax", 256): 0.022})
    a1 = run(tmp_path / "a1", {("primal", 256): 0.006, ("softmax", 256): 0.020}, failed=("primal", 512))
    a2 = run(tmp_path / "a2", {("primal", 256): 0.006, ("softmax", 256): 0.022})
    rows = {r["method"]: r for r in bench_compare.compare([b1, b2], [a1, a2])}
    assert set(rows) == {"primal", "softmax"}  # a cell measured on one side only is left out
    assert rows["primal"]["ratio"] == pytest.approx(0.006 / 0.011)
    assert rows["primal"]["round_ratios"] == pytest.approx([0.6, 0.5])
    assert rows["softmax"]["ratio"] == pytest.approx(1.0)


def test_a_folder_without_results_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--before", str(tmp_path / "empty"), "--after", str(tmp_path / "empty")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "no results.json" in proc.stderr

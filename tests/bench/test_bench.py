"""primal bench: the analysis maths, a tiny real grid, budgets, outputs and the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from primal_attention.bench import QUICK, GridConfig
from primal_attention.bench.harness import run_grid
from primal_attention.bench.methods import METHODS, availability
from primal_attention.bench.analysis import crossover, growth_exponent
from primal_attention.bench.report import write_outputs
from primal_attention.bench.workloads import Case, build

ROOT = Path(__file__).resolve().parents[2]


def test_crossover_interpolates_on_the_log_log_line() -> None:
    base = {256: 1.0, 512: 4.0, 1024: 16.0}  # quadratic
    method = {256: 2.0, 512: 8.0, 1024: 8.0}  # loses at 256 and 512, wins at 1024
    c = crossover(method, base, None)
    assert c["kind"] == "interpolated" and 512 < c["n"] < 1024
    # ratio 0.5 at 512 and 2 at 1024: the log-ratio crosses zero half-way, at sqrt(512 * 1024)
    assert c["n"] == pytest.approx(math.sqrt(512 * 1024))


def test_crossover_edge_cases() -> None:
    assert crossover({256: 1.0, 512: 1.0}, {256: 2.0, 512: 3.0}, None)["kind"] == "at or below the smallest length"
    assert crossover({256: 3.0, 512: 3.0}, {256: 2.0, 512: 2.0}, None)["n"] is None
    # the baseline stopped at 512 (over budget) while the method ran on: the method wins there
    c = crossover({256: 3.0, 512: 3.0}, {256: 2.0}, 512)
    assert c["n"] == 512 and c["kind"] == "at the first length where it wins"
    assert crossover({256: 1.0}, {512: 1.0}, None)["kind"] == "no common lengths"


def test_growth_exponent() -> None:
    assert growth_exponent({1024: 1.0, 2048: 2.0, 4096: 4.0, 8192: 8.0}) == pytest.approx(1.0)
    assert growth_exponent({2048: 1.0, 4096: 4.0}) == pytest.approx(2.0)
    assert growth_exponent({2048: 1.0}) is None


@pytest.mark.parametrize("level", ["layer", "train", "infer"])
def test_every_method_runs_every_level(level: str) -> None:
    for name, spec in METHODS.items():
        if spec.external:  # the authors' code, given by path: tests/bench/test_authors_method.py
            continue
        assert availability(name) is None, name
        build(Case(level, name, 32, 2, dim=16, heads=2))()


def _linear_output_dtypes(case: Case) -> set[torch.dtype]:
    seen: set[torch.dtype] = set()

    def hook(module, args, output) -> None:
        if isinstance(module, torch.nn.Linear):
            seen.add(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        build(case)()
    finally:
        handle.remove()
    return seen


def test_bf16_runs_the_linears_in_bf16_and_unknown_case() -> None:
    assert _linear_output_dtypes(Case("train", "primal", 32, 2, dtype="bf16", dim=16, heads=2)) == {torch.bfloat16}
    assert _linear_output_dtypes(Case("train", "primal", 32, 2, dtype="fp32", dim=16, heads=2)) == {torch.float32}
    with pytest.raises(ValueError, match="unknown level"):
        build(Case("nope", "primal", 32, 2))
    assert "unknown method" in availability("flash9")


def test_tiny_grid_records_outputs_and_budgets(tmp_path: Path) -> None:
    config = GridConfig(levels=("layer", "train"), seq_lens=(32, 64, 128), batch=2, dtypes=("fp32",),
                        modes=("eager",), methods=("primal", "softmax", "softmax_materialized"), repeats=2,
                        measure_memory=True, count_ops_lengths=(64,), memory_only_lengths=(),
                        time_budget_s=1e6, memory_budget_gb=1e3)  # no budget stops on a loaded machine
    result = run_grid(config, log=lambda _: None)
    records = result["records"]
    assert {(r["level"], r["method"], r["seq_len"]) for r in records} == {
        (lvl, m, n) for lvl in config.levels for m in config.methods for n in config.seq_lens}
    for r in records:
        assert r["status"] == "ok", r
        assert r["time"]["median"] > 0 and r["time"]["q25"] <= r["time"]["median"] <= r["time"]["q75"]
        assert ("flops" in r) == (r["seq_len"] == 64)
    paths = write_outputs(result, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert {t["target"] for t in data["analysis"]["targets"]} >= {"crossover vs SDPA (time)"}
    assert "| primal |" in paths["markdown"].read_text()
    for key in ("time_train_fp32_eager", "memory_train_fp32_eager", "time_layer_fp32_eager"):
        assert paths[key].stat().st_size > 1000 and paths[key].read_bytes()[:4] == b"\x89PNG"


def test_cpu_memory_sees_the_attention_matrix() -> None:
    """Materialized softmax must hold B·H·N² float32 probabilities (16 MiB here); the primal layer holds no
    N×N matrix, so it needs far less."""
    from primal_attention.bench.memory import MemoryServer

    server = MemoryServer(threads=1)
    try:
        got = {m: server.measure(asdict(Case("layer", m, 1024, 2, dim=16, heads=2)), count_ops=False, timeout_s=120)
               for m in ("softmax_materialized", "primal")}
    finally:
        server.close()
    matrix = 2 * 2 * 1024 * 1024 * 4
    assert got["softmax_materialized"]["memory_bytes"] >= matrix, got
    assert got["primal"]["memory_bytes"] < got["softmax_materialized"]["memory_bytes"] / 4, got


def test_time_budget_stops_a_method_and_marks_it() -> None:
    config = GridConfig(levels=("layer",), seq_lens=(32, 64, 128), batch=2, dtypes=("fp32",), modes=("eager",),
                        methods=("softmax_materialized",), repeats=1, time_budget_s=1e-9, measure_memory=False)
    records = run_grid(config, log=lambda _: None)["records"]
    statuses = [r["status"] for r in records]
    assert statuses[0] == "over_time_budget" and len(records) == 1 and "budget" in records[0]["note"]


def test_quick_preset_is_the_target_grid() -> None:
    assert QUICK.levels == ("train",) and 4096 in QUICK.seq_lens and 256 in QUICK.seq_lens
    assert {"primal", "primal_reference", "softmax", "softmax_materialized"} <= set(QUICK.methods)
    assert QUICK.max_total_s is not None and QUICK.max_total_s < 180


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "primal_attention.cli", "bench", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)


def test_cli_runs_a_grid_and_rerenders_from_json(tmp_path: Path) -> None:
    out = tmp_path / "b"
    proc = _cli("--levels", "train", "--seq-lens", "16,32", "--batch", "2", "--methods", "primal,softmax",
                "--repeats", "1", "--no-memory", "--dtypes", "fp32", "--modes", "eager", "--out", str(out),
                "--doc", str(tmp_path / "eff.md"))
    assert proc.returncode == 0, proc.stderr
    assert "target crossover vs SDPA (time)" in proc.stdout
    assert (out / "results.json").exists() and (out / "time_train_fp32_eager.png").exists()
    doc = (tmp_path / "eff.md").read_text()
    assert "## CPU" in doc and "GPU" in doc
    proc = _cli("--from-json", str(out / "results.json"), "--out", str(tmp_path / "again"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "again" / "results.md").read_text() == (out / "results.md").read_text()


def test_cli_bad_arguments() -> None:
    proc = _cli("--seq-lens", "0,12")
    assert proc.returncode == 2 and "positive integers" in proc.stderr
    proc = _cli("--methods", "primal,flash9")
    assert proc.returncode == 2 and "flash9" in proc.stderr


def test_merge_fills_skipped_cases_and_rejects_double_measurements() -> None:
    from primal_attention.bench.report import merge

    def rec(level: str, n: int, status: str) -> dict:
        return {"level": level, "dtype": "fp32", "mode": "eager", "method": "primal", "seq_len": n, "status": status}

    a = {"meta": {"command": "a", "wall_s": 1.0}, "limits": {}, "records": [rec("train", 256, "ok"),
                                                                            rec("layer", 256, "grid_time_limit")]}
    b = {"meta": {"command": "b", "wall_s": 2.0}, "limits": {}, "records": [rec("layer", 256, "ok")]}
    m = merge([a, b])
    assert [r["status"] for r in m["records"]] == ["ok", "ok"] and m["meta"]["wall_s"] == 3.0
    with pytest.raises(ValueError, match="more than one run"):
        merge([a, a])


def test_a_baseline_stopped_by_time_is_a_time_win_but_not_a_memory_win() -> None:
    from primal_attention.bench.analysis import analyse

    def rec(method: str, n: int, status: str, t: float | None, mem: float | None) -> dict:
        r = {"level": "train", "dtype": "fp32", "mode": "eager", "method": method, "seq_len": n, "status": status}
        if t is not None:
            r["time"] = {"median": t}
        if mem is not None:
            r["memory_bytes"] = mem
        return r

    result = {"meta": {"config": {"batch": 8}}, "limits": {"matmul_peak_gflops": 1.0, "bandwidth_peak_gbs": 1.0},
              "records": [rec("softmax", 256, "ok", 1.0, 10.0), rec("softmax", 512, "over_time_budget", None, None),
                          rec("primal", 256, "ok", 2.0, 20.0), rec("primal", 512, "ok", 4.0, 40.0)]}
    entry = analyse(result)["groups"]["train/fp32/eager"]["primal"]
    assert entry["time_crossover"]["n"] == 512
    assert entry["memory_crossover"]["n"] is None


def test_targets_against_the_authors_only_where_timed_side_by_side() -> None:
    from primal_attention.bench.analysis import authors_targets, curves

    def rec(level: str, method: str, t: float, mem: float | None = None) -> dict:
        r = {"level": level, "dtype": "fp32", "mode": "eager", "method": method, "seq_len": 4096, "status": "ok",
             "time": {"median": t}}
        if mem is not None:
            r["memory_bytes"] = mem
        return r

    groups = curves([rec("layer", "primal", 0.02, 30.0), rec("layer", "authors", 0.15, 60.0),
                     rec("train", "primal", 0.2), rec("train", "authors", 0.4)])
    rows = {r["target"]: r for r in authors_targets(groups)}
    layer = rows["layer + KSVD term fwd+bwd vs the authors' PrimalFormer, N 4096"]
    assert layer["value"] == pytest.approx(7.5) and layer["met"] is True
    assert rows["layer + KSVD term fwd+bwd: peak memory vs the authors', N 4096"]["value"] == pytest.approx(0.5)
    train = rows["model training step vs the authors' PrimalFormer, N 4096"]
    assert train["value"] == pytest.approx(2.0) and train["met"] is False
    assert len(rows) == 3  # no memory for the training step: no memory row
    assert authors_targets(curves([rec("layer", "primal", 0.02)])) == []  # authors not run: no rows


def test_the_layer_target_is_compared_with_the_analytic_floor() -> None:
    from primal_attention.bench.analysis import curves
    from primal_attention.bench.tables import _floor_vs_authors_target

    rec = {"level": "layer", "dtype": "fp32", "mode": "eager", "method": "authors", "seq_len": 4096, "status": "ok",
           "time": {"median": 0.087}}
    (line,) = [x for x in _floor_vs_authors_target(curves([rec]), {"seq_len": 4096, "analytic_floor_s": 0.022}) if x]
    assert "asks for 17.4 ms, below the floor" in line and "4.0× faster than the authors'" in line
    (line,) = [x for x in _floor_vs_authors_target(curves([rec]), {"seq_len": 4096, "analytic_floor_s": 0.010}) if x]
    assert "above the floor" in line
    assert _floor_vs_authors_target(curves([]), {"seq_len": 4096, "analytic_floor_s": 0.01}) == []

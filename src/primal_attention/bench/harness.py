"""Run a :class:`~primal_attention.bench.grid.GridConfig` and collect one record per case.

For every (level, dtype, mode) and every N, ascending:

1. each method still running gets a forecast of its call time and peak memory at this N from its
   last two lengths (log-log line); a forecast over a budget stops the method, marked, without
   running it (so the N×N softmax is never asked for 70 GB);
2. its peak memory is measured in isolation (:mod:`primal_attention.bench.memory`), which also
   counts the FLOPs and bytes of a call (:mod:`primal_attention.bench.counters`);
3. the surviving methods are built side by side in this process, warmed up, and timed in
   interleaved rounds (the order rotates each round), so every ratio compares calls made under
   the same load; the record keeps median, quartiles and minimum over the rounds.

A record's ``status`` is "ok", "over_time_budget", "over_memory_budget", "grid_time_limit",
"unavailable" (with the reason) or "error".
"""

from __future__ import annotations

import gc
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from primal_attention.bench.grid import GridConfig
from primal_attention.bench.limits import measure_limits
from primal_attention.bench.memory import MemoryServer, measure_case
from primal_attention.bench.methods import METHODS, availability
from primal_attention.bench.timing import Timing, sync
from primal_attention.bench.workloads import Case, build
from primal_attention.provenance import shown_command

Record = dict[str, Any]


def _available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


def _forecast(points: list[tuple[int, float]], seq_len: int) -> float | None:
    """Extrapolate (N, value) points to seq_len along the log-log line of the last two."""
    pts = [(n, v) for n, v in points if v and v > 0]
    if not pts:
        return None
    if len(pts) == 1:
        n0, v0 = pts[0]
        return v0 * seq_len / n0  # linear growth: an optimistic forecast
    (n0, v0), (n1, v1) = pts[-2], pts[-1]
    slope = math.log(v1 / v0) / math.log(n1 / n0) if n1 != n0 else 1.0
    return v1 * (seq_len / n1) ** max(slope, 0.0)


def _git_revision() -> str | None:
    try:
        root = Path(__file__).resolve().parents[3]
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5)
        if rev.returncode:
            return None
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "git": _git_revision(),
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    info["load_average"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    return info


def _timing_dict(times: list[float]) -> dict[str, float]:
    return Timing.from_samples(times).as_dict()


def run_grid(
    config: GridConfig,
    *,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the grid; returns {"meta", "limits", "records"} (see module docstring)."""
    start = time.perf_counter()
    if config.threads:
        torch.set_num_threads(config.threads)
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("primal bench: --device cuda asked for, but torch.cuda.is_available() is False")
    retained = False
    if config.retain_freed_memory and not config.device.startswith("cuda"):
        from primal_attention.allocator import retain_freed_memory

        retained = retain_freed_memory()
    memory_budget = (
        config.memory_budget_gb * 1e9 if config.memory_budget_gb is not None else 0.5 * _available_memory_bytes()
    )
    meta = {
        "config": config.as_dict(),
        "machine": machine_info(config.device),
        "memory_budget_bytes": memory_budget,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": shown_command(sys.argv),
        "retain_freed_memory": retained,
    }
    log(f"primal bench: {config.device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    limits = measure_limits(config.device)
    log("limits: " + ", ".join(f"{k} {v:.1f}" for k, v in limits.items()))

    unavailable = {m: availability(m) for m in config.methods}
    records: list[Record] = []
    server = None
    if config.measure_memory and not config.device.startswith("cuda"):
        server = MemoryServer(config.threads)
    try:
        for level in config.levels:
            for dtype in config.dtypes:
                for mode in config.modes:
                    methods = list(config.methods_for(mode))
                    records += _run_curve_set(
                        config, level, dtype, mode, methods, unavailable, memory_budget, server, start, log
                    )
    finally:
        if server is not None:
            server.close()
    meta["wall_s"] = time.perf_counter() - start
    meta["limits_after"] = measure_limits(config.device, repeats=3)
    return {"meta": meta, "limits": limits, "records": records}


def _run_curve_set(
    config: GridConfig,
    level: str,
    dtype: str,
    mode: str,
    methods: list[str],
    unavailable: dict[str, str | None],
    memory_budget: float,
    server: MemoryServer | None,
    start: float,
    log: Callable[[str], None],
) -> list[Record]:
    records: list[Record] = []
    stopped: dict[str, str] = {}
    times: dict[str, list[tuple[int, float]]] = {m: [] for m in methods}
    mems: dict[str, list[tuple[int, float]]] = {m: [] for m in methods}
    for m in methods:
        if unavailable.get(m):
            stopped[m] = "unavailable"
            records.append(_record(Case(level, m, 0, config.batch, dtype, mode, config.device), "unavailable",
                                   note=unavailable[m]))
    for seq_len in config.seq_lens:
        pending: list[Case] = []
        for m in methods:
            if m in stopped:
                continue
            case = Case(level, m, seq_len, config.batch, dtype, mode, config.device)
            if config.max_total_s is not None and time.perf_counter() - start > config.max_total_s:
                stopped[m] = "grid_time_limit"
                records.append(_record(case, "grid_time_limit", note=f"grid time limit {config.max_total_s:.0f} s reached"))
                continue
            t_fc = _forecast(times[m], seq_len)
            m_fc = _forecast(mems[m], seq_len)
            if t_fc is not None and t_fc > config.time_budget_s:
                stopped[m] = "over_time_budget"
                note = f"forecast {t_fc:.1f} s per call > budget {config.time_budget_s:.0f} s"
                memory = None
                if (config.measure_memory and seq_len in config.memory_only_lengths
                        and (m_fc is None or m_fc <= memory_budget)):
                    memory = _measure_memory(case, server, config, count_ops=False,
                                             timeout_s=config.memory_only_timeout_s)
                    if "error" in memory:
                        note += f"; memory-only call failed: {memory['error']}"
                        memory = None
                    else:
                        note += "; peak memory measured with one isolated call"
                        log(f"  {level} {dtype} {mode} N {seq_len} {case.method}: memory only "
                            f"{memory['memory_bytes'] / 2**20:.1f} MiB")
                records.append(_record(case, "over_time_budget", memory=memory, forecast_s=t_fc, note=note))
                continue
            if m_fc is not None and m_fc > memory_budget:
                stopped[m] = "over_memory_budget"
                records.append(_record(case, "over_memory_budget", forecast_bytes=m_fc,
                                       note=f"forecast {m_fc / 1e9:.1f} GB > budget {memory_budget / 1e9:.1f} GB"))
                continue
            pending.append(case)

        measured: dict[str, dict[str, Any]] = {}
        survivors: list[Case] = []
        for case in pending:
            info: dict[str, Any] = {}
            if config.measure_memory:
                count = config.count_ops_lengths is None or seq_len in config.count_ops_lengths
                info = _measure_memory(case, server, config, count_ops=count)
                if "error" in info:
                    status = "over_time_budget" if info.get("timeout") else (
                        "over_memory_budget" if info.get("killed") else "error")
                    stopped[case.method] = status
                    records.append(_record(case, status, note=info["error"]))
                    log(f"  {level} {dtype} {mode} N {seq_len} {case.method}: {status}: {info['error']}")
                    continue
                if info["memory_bytes"] > memory_budget:
                    stopped[case.method] = "over_memory_budget"
                    records.append(_record(case, "over_memory_budget", memory=info,
                                           note=f"{info['memory_bytes'] / 1e9:.1f} GB > budget"))
                    continue
                if info["memory_bytes"] >= 2**20:  # below 1 MiB the RSS delta is noise: no basis for a forecast
                    mems[case.method].append((seq_len, float(info["memory_bytes"])))
            measured[case.method] = info
            survivors.append(case)

        records += _time_side_by_side(config, survivors, measured, times, stopped, log)
        gc.collect()
    return records


def _measure_memory(case: Case, server: MemoryServer | None, config: GridConfig, *, count_ops: bool = True,
                    timeout_s: float | None = None) -> dict[str, Any]:
    budget = max(config.time_budget_s * 6, 60.0) if case.mode == "compile" else max(config.time_budget_s * 4, 30.0)
    budget = timeout_s if timeout_s is not None else budget
    if server is not None:
        return server.measure(case.as_dict(), count_ops=count_ops, timeout_s=budget)
    try:  # CUDA: in this process
        return measure_case(case.as_dict(), count_ops=count_ops and case.mode == "eager")
    except torch.cuda.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        return {"error": f"CUDA out of memory: {str(err).splitlines()[0]}", "killed": True}
    except Exception as err:  # noqa: BLE001
        return {"error": f"{type(err).__name__}: {err}"}
    finally:
        gc.collect()
        if case.device.startswith("cuda"):
            torch.cuda.empty_cache()


def _time_side_by_side(
    config: GridConfig,
    cases: list[Case],
    measured: dict[str, dict[str, Any]],
    times: dict[str, list[tuple[int, float]]],
    stopped: dict[str, str],
    log: Callable[[str], None],
) -> list[Record]:
    records: list[Record] = []
    steps: dict[str, Callable[[], None]] = {}
    first: dict[str, float] = {}
    for case in cases:
        try:
            step = build(case)
            t0 = time.perf_counter()
            for _ in range(max(config.warmup, 1)):
                step()
            sync(case.device)
            first[case.method] = time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001 - the grid goes on; the case is marked
            stopped[case.method] = "error"
            records.append(_record(case, "error", memory=measured.get(case.method), note=f"{type(err).__name__}: {err}"))
            log(f"  {case.level} N {case.seq_len} {case.method}: error {type(err).__name__}: {err}")
            continue
        per_call = first[case.method] / max(config.warmup, 1)
        if case.mode == "eager" and per_call > config.time_budget_s:
            stopped[case.method] = "over_time_budget"
            rec = _record(case, "over_time_budget", memory=measured.get(case.method),
                          note=f"warm-up call took {per_call:.1f} s > budget {config.time_budget_s:.0f} s")
            rec["time"] = _timing_dict([per_call])
            records.append(rec)
            times[case.method].append((case.seq_len, per_call))
            continue
        steps[case.method] = step

    samples: dict[str, list[float]] = {m: [] for m in steps}
    order = list(steps)
    for r in range(config.repeats):
        rot = order[r % len(order):] + order[: r % len(order)] if order else []
        for m in rot:
            t0 = time.perf_counter()
            steps[m]()
            sync(config.device)
            samples[m].append(time.perf_counter() - t0)
    for case in cases:
        m = case.method
        if m not in steps:
            continue
        timing = _timing_dict(samples[m]) if samples[m] else _timing_dict([first[m]])
        rec = _record(case, "ok", memory=measured.get(m))
        rec["time"] = timing
        if case.mode == "compile":
            rec["compile_s"] = first[m]
        records.append(rec)
        times[m].append((case.seq_len, timing["median"]))
        mem = measured.get(m, {}).get("memory_bytes")
        log(f"  {case.level:5s} {case.dtype} {case.mode:7s} N {case.seq_len:6d} {METHODS[m].label:22s} "
            f"{timing['median'] * 1e3:9.1f} ms" + (f"  {mem / 2**20:9.1f} MiB" if mem is not None else ""))
        if timing["median"] > config.time_budget_s:
            stopped[m] = "over_time_budget"
    steps.clear()
    return records


def _record(case: Case, status: str, *, memory: dict[str, Any] | None = None, note: str | None = None,
            **extra: Any) -> Record:
    rec: Record = {**case.as_dict(), "label": METHODS[case.method].label, "status": status}
    if memory:
        for key in ("memory_bytes", "memory_method", "idle_rss_bytes", "flops", "bytes", "flops_by_op", "call_s"):
            if key in memory:
                rec[key] = memory[key]
    if note:
        rec["note"] = note
    rec.update(extra)
    return rec

"""From a run's records to numbers that answer questions: crossovers, growth exponents, the issue's
targets and the distance to the machine's limits (:mod:`primal_attention.bench.tables` renders them,
:mod:`primal_attention.bench.plots` draws them, :mod:`primal_attention.bench.report` writes them).

Definitions (used in the tables):

* speed-up of a method at N = median time of SDPA softmax / median time of the method, same level,
  dtype and mode, measured side by side in the same rounds;
* crossover length (time or memory) against SDPA = the N from which the method is faster (lighter)
  at every measured length above, interpolated on the log-log line between the last grid length
  where it is not and the first where it is. A length where SDPA stopped (over a budget) and the
  method did not counts as the method winning (for memory, only when SDPA stopped at the memory budget). "≤ N₀" means it wins from the smallest length.
* growth exponent = least-squares slope of log(time) against log(N) over N ≥ 2048.
"""

from __future__ import annotations

import math
from typing import Any

from primal_attention.bench.methods import BASELINE

Record = dict[str, Any]

TARGET_N = 4096
EXPONENT_FROM = 2048


def curves(records: list[Record]) -> dict[tuple[str, str, str], dict[str, dict[str, Any]]]:
    """(level, dtype, mode) -> method -> {"time": {N: s}, "memory": {N: bytes}, "stopped": (N, status) | None}."""
    out: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for r in records:
        group = out.setdefault((r["level"], r["dtype"], r["mode"]), {})
        c = group.setdefault(r["method"], {"time": {}, "memory": {}, "stopped": None, "note": None,
                                           "flops": {}, "bytes": {}})
        n = r["seq_len"]
        if r["status"] == "ok" or (r["status"] == "over_time_budget" and "time" in r):
            if "time" in r:
                c["time"][n] = r["time"]["median"]
        if r.get("memory_bytes") is not None:
            c["memory"][n] = r["memory_bytes"]
        if r.get("flops") is not None:
            c["flops"][n] = r["flops"]
            c["bytes"][n] = r.get("bytes")
        if r["status"] != "ok" and c["stopped"] is None:
            c["stopped"] = (n, r["status"])
            c["note"] = r.get("note")
    return out


def crossover(method: dict[int, float], base: dict[int, float], base_stop: int | None) -> dict[str, Any]:
    """Where ``method`` becomes and stays below ``base`` (time or memory), see the module docstring."""
    ns = sorted(method)
    ratios = []  # base / method: > 1 when the method wins
    for n in ns:
        if n in base:
            ratios.append((n, base[n] / method[n] if method[n] > 0 else math.inf))
        elif base_stop is not None and n >= base_stop:
            ratios.append((n, math.inf))
    if not ratios:
        return {"n": None, "kind": "no common lengths"}
    last_lose = None
    for i, (n, r) in enumerate(ratios):
        if r <= 1.0:
            last_lose = i
    if last_lose is None:
        return {"n": ratios[0][0], "kind": "at or below the smallest length", "grid_n": ratios[0][0]}
    if last_lose == len(ratios) - 1:
        return {"n": None, "kind": f"not up to N {ratios[-1][0]}", "grid_n": None}
    (n0, r0), (n1, r1) = ratios[last_lose], ratios[last_lose + 1]
    if math.isinf(r1) or r0 <= 0:
        return {"n": n1, "kind": "at the first length where it wins", "grid_n": n1}
    frac = (0.0 - math.log(r0)) / (math.log(r1) - math.log(r0))
    n_star = math.exp(math.log(n0) + frac * (math.log(n1) - math.log(n0)))
    return {"n": n_star, "kind": "interpolated", "grid_n": n1}


def growth_exponent(times: dict[int, float], from_n: int = EXPONENT_FROM) -> float | None:
    pts = [(math.log(n), math.log(t)) for n, t in sorted(times.items()) if n >= from_n and t > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def analyse(result: dict[str, Any]) -> dict[str, Any]:
    """Crossovers and exponents per curve, the issue's targets, the distance to the limits."""
    groups = curves(result["records"])
    per_group: dict[str, Any] = {}
    for (level, dtype, mode), methods in groups.items():
        base = methods.get(BASELINE)
        entry: dict[str, Any] = {}
        for name, c in methods.items():
            e: dict[str, Any] = {"exponent": growth_exponent(c["time"])}
            if base is not None and name != BASELINE:
                stop = base["stopped"][0] if base["stopped"] else None
                # a baseline stopped by the time budget says nothing about its memory there
                memory_stop = stop if base["stopped"] and base["stopped"][1] == "over_memory_budget" else None
                e["time_crossover"] = crossover(c["time"], base["time"], stop)
                e["memory_crossover"] = crossover(c["memory"], base["memory"], memory_stop)
            entry[name] = e
        per_group[f"{level}/{dtype}/{mode}"] = entry
    return {"groups": per_group, "targets": targets(groups), "limits": distance_to_limit(result, groups)}


def value_at(c: dict[str, Any] | None, kind: str, n: int) -> float | None:
    return None if c is None else c[kind].get(n)


def targets(groups: dict[tuple[str, str, str], dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The issue's targets on the training step, B as run, fp32, eager (and compile where run)."""
    rows: list[dict[str, Any]] = []
    for mode in ("eager", "compile"):
        g = groups.get(("train", "fp32", mode))
        if not g or "primal" not in g:
            continue
        p, sd = g["primal"], g.get("softmax")
        mat, ref = g.get("softmax_materialized"), g.get("primal_reference")
        if mode == "compile":
            eager = groups.get(("train", "fp32", "eager"), {})
            mat = mat or eager.get("softmax_materialized")
            ref = ref or eager.get("primal_reference")
        tag = "" if mode == "eager" else " (compiled primal and SDPA; N×N and reference eager)"

        def ratio(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None or b == 0 else a / b

        def row(name: str, value: float | None, ok: bool | None, goal: str, how: str) -> None:
            rows.append({"target": name + tag, "goal": goal, "value": value, "met": ok, "how": how, "mode": mode})

        n = TARGET_N
        r = ratio(value_at(sd, "time", n), value_at(p, "time", n))
        row(f"speed vs SDPA softmax model, N {n}", r, None if r is None else r >= 15, "≥ 15×", "t_SDPA / t_primal")
        r = ratio(value_at(p, "memory", n), value_at(sd, "memory", n))
        row(f"peak memory vs SDPA model, N {n}", r, None if r is None else r <= 1.0, "≤ 1.0×", "mem_primal / mem_SDPA")
        r = ratio(value_at(p, "memory", n), value_at(mat, "memory", n))
        row(f"peak memory vs N×N softmax model, N {n}", r, None if r is None else r <= 0.2, "≤ 0.2×",
            "mem_primal / mem_N×N")
        r = ratio(value_at(ref, "time", n), value_at(p, "time", n))
        row(f"speed vs our reference path, N {n}", r, None if r is None else r >= 3, "≥ 3×", "t_reference / t_primal")
        e = growth_exponent(p["time"])
        row(f"time exponent, N ≥ {EXPONENT_FROM}", e, None if e is None else 0.9 <= e <= 1.1, "0.9 – 1.1",
            "slope of log t vs log N")
        if sd is not None:
            c = crossover(p["time"], sd["time"], sd["stopped"][0] if sd["stopped"] else None)
            ok = None if c["kind"] == "no common lengths" else (c["n"] is not None and c["n"] <= 512)
            row("crossover vs SDPA (time)", c["n"], ok, "≤ 512", c["kind"])
    rows += authors_targets(groups)
    return rows


def authors_targets(groups: dict[tuple[str, str, str], dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Issue 16's targets against the authors' PrimalFormer (method ``authors``), fp32 eager, N 4096:
    only where the run timed it beside ``primal``."""
    rows: list[dict[str, Any]] = []
    goals = {"layer": (5.0, "layer + KSVD term fwd+bwd"), "train": (2.5, "model training step")}
    for level, (goal, what) in goals.items():
        g = groups.get((level, "fp32", "eager"), {})
        p, a = g.get("primal"), g.get("authors")
        if p is None or a is None:
            continue
        t_p, t_a = value_at(p, "time", TARGET_N), value_at(a, "time", TARGET_N)
        if t_p and t_a:
            r = t_a / t_p
            rows.append({"target": f"{what} vs the authors' PrimalFormer, N {TARGET_N}", "goal": f"≥ {goal:g}×",
                         "value": r, "met": r >= goal, "how": "t_authors / t_primal", "mode": "eager"})
        m_p, m_a = value_at(p, "memory", TARGET_N), value_at(a, "memory", TARGET_N)
        if m_p and m_a:
            rows.append({"target": f"{what}: peak memory vs the authors', N {TARGET_N}", "goal": "≤ 1.0×",
                         "value": m_p / m_a, "met": m_p / m_a <= 1.0, "how": "mem_primal / mem_authors",
                         "mode": "eager"})
    return rows


def distance_to_limit(result: dict[str, Any], groups: dict) -> list[dict[str, Any]]:
    """Achieved matmul throughput and traffic of the primal path as a fraction of the measured limits."""
    from primal_attention.bench.counters import primal_layer_floor

    lim = result["limits"]
    peak, bw = lim["matmul_peak_gflops"] * 1e9, lim["bandwidth_peak_gbs"] * 1e9
    rows = []
    for (level, dtype, mode), methods in sorted(groups.items()):
        if dtype != "fp32" or mode != "eager":
            continue
        for name in ("primal", "primal_reference", BASELINE):
            c = methods.get(name)
            if c is None:
                continue
            n = TARGET_N if TARGET_N in c["time"] else (max(c["time"]) if c["time"] else None)
            if n is None or n not in c["flops"]:
                continue
            t, flops, nbytes = c["time"][n], c["flops"][n], c["bytes"][n] or 0
            row = {
                "level": level, "method": name, "seq_len": n, "time_s": t, "flops": flops, "bytes": nbytes,
                "gflops": flops / t / 1e9, "matmul_fraction": flops / t / peak,
                "gbs": nbytes / t / 1e9, "bandwidth_fraction": nbytes / t / bw,
                "floor_s": max(flops / peak, nbytes / bw),
            }
            row["floor_fraction"] = row["floor_s"] / t
            if level == "layer" and name == "primal":
                batch = result["meta"]["config"]["batch"]
                f = primal_layer_floor(batch, n, 64, 2)
                row["analytic_flops"], row["analytic_bytes"] = f["flops"], f["bytes"]
                row["analytic_floor_s"] = max(f["flops"] / peak, f["bytes"] / bw)
                row["analytic_floor_fraction"] = row["analytic_floor_s"] / t
            rows.append(row)
    return rows

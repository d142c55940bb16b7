"""From a run's records to numbers that answer questions: crossovers, growth exponents, the issue's
targets, the distance to the machine's limits; and the JSON, markdown tables and PNG plots.

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

import json
import math
from pathlib import Path
from typing import Any

from primal_attention.bench.methods import BASELINE, METHODS

Record = dict[str, Any]

TARGET_N = 4096
EXPONENT_FROM = 2048


# -- analysis -------------------------------------------------------------------------------------

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


def _at(c: dict[str, Any] | None, kind: str, n: int) -> float | None:
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
        r = ratio(_at(sd, "time", n), _at(p, "time", n))
        row(f"speed vs SDPA softmax model, N {n}", r, None if r is None else r >= 15, "≥ 15×", "t_SDPA / t_primal")
        r = ratio(_at(p, "memory", n), _at(sd, "memory", n))
        row(f"peak memory vs SDPA model, N {n}", r, None if r is None else r <= 1.0, "≤ 1.0×", "mem_primal / mem_SDPA")
        r = ratio(_at(p, "memory", n), _at(mat, "memory", n))
        row(f"peak memory vs N×N softmax model, N {n}", r, None if r is None else r <= 0.2, "≤ 0.2×",
            "mem_primal / mem_N×N")
        r = ratio(_at(ref, "time", n), _at(p, "time", n))
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
        t_p, t_a = _at(p, "time", TARGET_N), _at(a, "time", TARGET_N)
        if t_p and t_a:
            r = t_a / t_p
            rows.append({"target": f"{what} vs the authors' PrimalFormer, N {TARGET_N}", "goal": f"≥ {goal:g}×",
                         "value": r, "met": r >= goal, "how": "t_authors / t_primal", "mode": "eager"})
        m_p, m_a = _at(p, "memory", TARGET_N), _at(a, "memory", TARGET_N)
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


# -- output ---------------------------------------------------------------------------------------

def _ms(t: float | None) -> str:
    if t is None:
        return "–"
    return f"{t * 1e3:.0f}" if t >= 0.1 else f"{t * 1e3:.1f}"


def _mib(b: float | None) -> str:
    return "–" if b is None else f"{b / 2**20:.0f}"


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "–" if v is None else format(v, spec)


_STATUS = {"over_time_budget": "time budget", "over_memory_budget": "memory budget", "grid_time_limit": "grid time limit",
           "unavailable": "unavailable", "error": "error"}


def _cells(c: dict[str, Any], base: dict[str, Any], kind: str, ns: list[int], with_ratio: bool,
           with_base: Any, alone: Any) -> list[str]:
    """One table row's cells: the value at each N (with its ratio to the baseline), or why it is missing."""
    cells = []
    for n in ns:
        v = c[kind].get(n)
        b = base[kind].get(n)
        if v is None:
            cells.append(_stopped_cell(c, n) or "–")
        else:
            cells.append(with_base(v, b) if b and with_ratio else alone(v))
    return cells


def _crossover_cell(x: dict[str, Any] | None) -> str:
    return "–" if not x else (f"{x['n']:.0f} ({x['kind']})" if x.get("n") else x["kind"])


def _stopped_cell(c: dict[str, Any], n: int) -> str | None:
    if c["stopped"] and n >= c["stopped"][0]:
        return "(" + _STATUS.get(c["stopped"][1], c["stopped"][1]) + ")"
    return None


def _floor_vs_authors_target(groups: dict, limit_row: dict[str, Any]) -> list[str]:
    """Where the authors' layer was timed: how the ≥ 5× layer target compares with the analytic floor."""
    a = _at(groups.get(("layer", "fp32", "eager"), {}).get("authors"), "time", limit_row["seq_len"])
    if not a:
        return []
    goal, floor = a / 5, limit_row["analytic_floor_s"]
    verdict = (f"below the floor ({_ms(floor)} ms): no implementation reaches it on this machine, and a layer "
               f"at the floor would be {a / floor:.1f}× faster than the authors'" if goal < floor
               else f"above the floor ({_ms(floor)} ms): attainable in principle")
    return ["", f"The ≥ 5× layer target against the authors' layer ({_ms(a)} ms) asks for {_ms(goal)} ms, {verdict}."]


def markdown(result: dict[str, Any], analysis: dict[str, Any], *, plots: dict[str, str] | None = None,
             heading_level: int = 2) -> str:
    """Tables of one run: targets, distance to limits, then time / memory per level."""
    h = "#" * heading_level
    meta, lim = result["meta"], result["limits"]
    m = meta["machine"]
    lines = [
        f"{h} Run",
        "",
        f"- machine: {m.get('cpu', '?')} ({m.get('cpu_count')} logical CPUs), {m.get('gpu', m['device'])}, "
        f"{m['threads']} torch threads, torch {m['torch']}, Python {m['python']}, git {m.get('git')}",
        f"- started {meta['started']}, wall time {meta['wall_s']:.0f} s, load average at start "
        f"{', '.join(f'{x:.2f}' for x in (m.get('load_average') or []))}",
        f"- command: `{meta['command']}`",
        f"- batch {meta['config']['batch']}; repeats {meta['config']['repeats']} (interleaved rounds, median; "
        f"q25–q75 in the JSON); time budget {meta['config']['time_budget_s']} s per call; memory budget "
        f"{meta['memory_budget_bytes'] / 1e9:.1f} GB",
        f"- memory: {next((r['memory_method'] for r in result['records'] if r.get('memory_method')), 'not measured')}",
        "- timing process: freed CPU memory kept mapped for reuse (`primal_attention.allocator`), every method alike"
        if meta.get("retain_freed_memory") else "- timing process: glibc's default allocator policy",
        "",
        f"{h} Machine limits (measured in the same run)",
        "",
        "| quantity | at start | at end |",
        "|---|---|---|",
    ]
    after = meta.get("limits_after", {})
    for k, v in lim.items():
        unit = "GFLOP/s" if "gflops" in k else "GB/s"
        lines.append(f"| {k.replace('_gflops', '').replace('_gbs', '')} ({unit}) | {v:.1f} | {_fmt(after.get(k), '.1f')} |")
    lines += ["", f"{h} Targets (issue 4: training step; issue 16: against the authors' code; fp32, B {meta['config']['batch']})", ""]
    if analysis["targets"]:
        lines += ["| target | goal | measured | met | how |", "|---|---|---|---|---|"]
        for t in analysis["targets"]:
            met = "–" if t["met"] is None else ("yes" if t["met"] else "**no**")
            val = "–" if t["value"] is None else (f"{t['value']:.0f}" if "crossover" in t["target"] else f"{t['value']:.2f}")
            lines.append(f"| {t['target']} | {t['goal']} | {val} | {met} | {t['how']} |")
    else:
        lines.append("(no training-step fp32 results in this run)")
    groups = curves(result["records"])
    if analysis["limits"]:
        lines += ["", f"{h} Distance to the limits (fp32 eager)", "",
                  "FLOPs: matmul and attention-kernel FLOPs of one call, counted per operator; bytes: operator-level "
                  "traffic (inputs + outputs of every non-view operator, i.e. no reuse in cache between operators). "
                  "Floor = max(FLOPs / matmul peak, bytes / bandwidth peak).", "",
                  "| level | method | N | time (ms) | GFLOP | GFLOP/s | of matmul peak | GB moved | GB/s | of bandwidth | floor (ms) | floor / time |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in analysis["limits"]:
            lines.append(
                f"| {r['level']} | {METHODS[r['method']].label} | {r['seq_len']} | {_ms(r['time_s'])} | {r['flops'] / 1e9:.2f} | "
                f"{r['gflops']:.0f} | {r['matmul_fraction']:.0%} | {r['bytes'] / 1e9:.2f} | {r['gbs']:.1f} | "
                f"{r['bandwidth_fraction']:.0%} | {_ms(r['floor_s'])} | {r['floor_fraction']:.0%} |")
        for r in analysis["limits"]:
            if "analytic_floor_s" in r:
                lines += ["", f"Primal layer, analytic compulsory work at N {r['seq_len']}: {r['analytic_flops'] / 1e9:.2f} GFLOP "
                          f"and {r['analytic_bytes'] / 1e6:.0f} MB of main-memory traffic, floor {_ms(r['analytic_floor_s'])} ms "
                          f"= {r['analytic_floor_fraction']:.0%} of the measured {_ms(r['time_s'])} ms."]
                lines += _floor_vs_authors_target(groups, r)
    for key in sorted(groups, key=lambda k: (("train", "layer", "infer").index(k[0]) if k[0] in ("train", "layer", "infer") else 9, k[1], k[2])):
        level, dtype, mode = key
        methods = groups[key]
        ns = sorted({n for c in methods.values() for n in list(c["time"]) + list(c["memory"]) if n})
        gkey = f"{level}/{dtype}/{mode}"
        title = {"train": "training step (model)", "layer": "attention layer fwd+bwd", "infer": "inference forward (model)"}.get(level, level)
        lines += ["", f"{h} {title}, {dtype}, {mode}", ""]
        base = methods.get(BASELINE, {"time": {}, "memory": {}})
        lines += ["Time per call, ms (speed-up vs SDPA softmax in brackets):", "",
                  "| method | " + " | ".join(str(n) for n in ns) + " | exponent (N ≥ 2048) | crossover vs SDPA |",
                  "|---|" + "---|" * (len(ns) + 2)]
        for name, c in methods.items():
            cells = _cells(c, base, "time", ns, name != BASELINE, lambda t, b: _ms(t) + f" ({b / t:.1f}×)", _ms)
            a = analysis["groups"].get(gkey, {}).get(name, {})
            xs = _crossover_cell(a.get("time_crossover"))
            label = METHODS[name].label if name in METHODS else name
            if c["stopped"] and c["stopped"][1] == "unavailable":
                lines.append(f"| {label} | " + " | ".join("–" for _ in ns) + f" | – | unavailable: {c['note']} |")
                continue
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {_fmt(a.get('exponent'))} | {xs} |")
        if any(c["memory"] for c in methods.values()):
            lines += ["", "Peak memory of one call, MiB (ratio to SDPA softmax in brackets):", "",
                      "| method | " + " | ".join(str(n) for n in ns) + " | lighter than SDPA from |",
                      "|---|" + "---|" * (len(ns) + 1)]
            for name, c in methods.items():
                if c["stopped"] and c["stopped"][1] == "unavailable":
                    continue
                cells = _cells(c, base, "memory", ns, name != BASELINE, lambda v, b: _mib(v) + f" ({v / b:.2f})", _mib)
                a = analysis["groups"].get(gkey, {}).get(name, {})
                xs = _crossover_cell(a.get("memory_crossover"))
                lines.append(f"| {METHODS[name].label if name in METHODS else name} | " + " | ".join(cells) + f" | {xs} |")
        notes = [f"{METHODS[n].label}: {c['note']}" for n, c in methods.items() if c["note"] and c["stopped"][1] != "unavailable"]
        if notes:
            lines += ["", "Stopped: " + "; ".join(notes) + "."]
        if plots:
            for kind in ("time", "memory"):
                p = plots.get(f"{kind}_{level}_{dtype}_{mode}")
                if p:
                    lines += ["", f"![{kind} vs N, {title}, {dtype}, {mode}]({p})"]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], out_dir: Path, *, prefix: str = "") -> dict[str, str]:
    """Log-log time vs N and peak memory vs N, one line per method, per (level, dtype, mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    for (level, dtype, mode), methods in curves(result["records"]).items():
        for kind, ylabel in (("time", "time per call (s)"), ("memory", "peak memory of one call (MiB)")):
            series = {n: c for n, c in methods.items() if c[kind]}
            if not series:
                continue
            fig, ax = plt.subplots(figsize=(6.4, 4.4))
            for name, c in series.items():
                ns = sorted(c[kind])
                ys = [c[kind][n] / (2**20 if kind == "memory" else 1) for n in ns]
                label = METHODS[name].label if name in METHODS else name
                if c["stopped"]:
                    label += f" (stops at {c['stopped'][0]}: {_STATUS.get(c['stopped'][1], c['stopped'][1])})"
                style = "-" if name.startswith("primal") or name.startswith("softmax") else "--"
                lw = 2.4 if name == "primal" else 1.4
                ax.plot(ns, ys, style, marker="o", ms=3.5, lw=lw, label=label)
                if c["stopped"]:
                    ax.plot(ns[-1], ys[-1], "x", color="black", ms=8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{level}, {dtype}, {mode}, B {result['meta']['config']['batch']}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            fig.tight_layout()
            name = f"{prefix}{kind}_{level}_{dtype}_{mode}.png"
            fig.savefig(out_dir / name, dpi=110)
            plt.close(fig)
            files[f"{kind}_{level}_{dtype}_{mode}"] = name
    return files


def write_outputs(result: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """results.json (records + analysis), results.md and the PNG plots into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    analysis = analyse(result)
    full = {**result, "analysis": analysis}
    (out_dir / "results.json").write_text(json.dumps(full, indent=1, default=_json_default))
    plots = plot(result, out_dir)
    (out_dir / "results.md").write_text("# primal bench\n\n" + markdown(result, analysis, plots=plots))
    paths = {"json": out_dir / "results.json", "markdown": out_dir / "results.md"}
    paths.update({k: out_dir / v for k, v in plots.items()})
    return paths


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and (math.isinf(o) or math.isnan(o)):
        return str(o)
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def load(path: Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    data.pop("analysis", None)
    return data


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from runs of disjoint grids (e.g. one run per level) on the same machine.

    Records are concatenated; a configuration that one run skipped at its grid time limit is taken
    from the run that measured it, and one measured in two runs is an error (the ratios would mix
    rounds). Meta and limits are the first run's, with every run's command and wall time kept.
    """
    if not results:
        raise ValueError("merge: no results given")
    chosen: dict[tuple, Record] = {}
    for result in results:
        for r in result["records"]:
            key = (r["level"], r["dtype"], r["mode"], r["method"], r["seq_len"])
            old = chosen.get(key)
            if old is not None and old["status"] == "ok" and r["status"] == "ok":
                raise ValueError(f"merge: {key} is measured in more than one run")
            if old is None or old["status"] == "grid_time_limit":  # a later run measured what an earlier skipped
                chosen[key] = r
    records = list(chosen.values())
    meta = dict(results[0]["meta"])
    if len(results) > 1:
        meta["command"] = "` ; `".join(r["meta"]["command"] for r in results)
        meta["wall_s"] = sum(r["meta"]["wall_s"] for r in results)
    return {**results[0], "meta": meta, "records": records}

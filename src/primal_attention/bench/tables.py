"""Markdown tables of a benchmark run and its analysis (:mod:`primal_attention.bench.analysis`)."""

from __future__ import annotations

from typing import Any

from primal_attention.bench.analysis import curves, value_at
from primal_attention.bench.methods import BASELINE, METHODS


def _ms(t: float | None) -> str:
    if t is None:
        return "–"
    return f"{t * 1e3:.0f}" if t >= 0.1 else f"{t * 1e3:.1f}"


def _mib(b: float | None) -> str:
    return "–" if b is None else f"{b / 2**20:.0f}"


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "–" if v is None else format(v, spec)


STOP_REASONS = {"over_time_budget": "time budget", "over_memory_budget": "memory budget", "grid_time_limit": "grid time limit",
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
        return "(" + STOP_REASONS.get(c["stopped"][1], c["stopped"][1]) + ")"
    return None


def _floor_vs_authors_target(groups: dict, limit_row: dict[str, Any]) -> list[str]:
    """Where the authors' layer was timed: how the ≥ 5× layer target compares with the analytic floor."""
    a = value_at(groups.get(("layer", "fp32", "eager"), {}).get("authors"), "time", limit_row["seq_len"])
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

"""Compare ``primal bench`` runs of two versions of the code: before / after a change, as ratios.

Give the run folders of each side (several runs per side: the rounds interleaved, before, after,
before, after, so drift on a noisy machine hits both sides); each cell's time is the median over
that side's runs. Prints one table (time before, after, after / before) per level and method, and
the spread of the ratio over the rounds; writes the same as JSON.

    .venv/bin/python scripts/bench_compare.py --before runs/b1 runs/b2 --after runs/a1 runs/a2 --out cmp.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def cells(run: Path) -> dict[tuple, float]:
    """(level, dtype, mode, method, N) -> median seconds per call (over the run's repeats) of one run's
    measured cells."""
    records = json.loads((run / "results.json").read_text())["records"]
    return {(r["level"], r["dtype"], r["mode"], r["label"], r["seq_len"]): r["time"]["median"]
            for r in records if r.get("status") == "ok" and r.get("time")}


def compare(before: list[Path], after: list[Path]) -> list[dict]:
    """One row per cell measured on both sides: medians, their ratio, and the per-round ratios."""
    b_runs, a_runs = [cells(p) for p in before], [cells(p) for p in after]
    keys = sorted(set.intersection(*(set(c) for c in b_runs + a_runs)))
    rows = []
    for key in keys:
        b = [c[key] for c in b_runs]
        a = [c[key] for c in a_runs]
        rounds = [ai / bi for ai, bi in zip(a, b)]
        rows.append({"level": key[0], "dtype": key[1], "mode": key[2], "method": key[3], "seq_len": key[4],
                     "before_ms": 1e3 * statistics.median(b), "after_ms": 1e3 * statistics.median(a),
                     "ratio": statistics.median(a) / statistics.median(b),
                     "round_ratios": rounds})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| level | method | N | before (ms) | after (ms) | after / before | per round |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        per = ", ".join(f"{x:.2f}" for x in r["round_ratios"])
        lines.append(f"| {r['level']} {r['dtype']} {r['mode']} | {r['method']} | {r['seq_len']} | {r['before_ms']:.1f} | "
                     f"{r['after_ms']:.1f} | {r['ratio']:.2f} | {per} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", nargs="+", type=Path, required=True)
    p.add_argument("--after", nargs="+", type=Path, required=True)
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    a = p.parse_args()
    for run in a.before + a.after:
        if not (run / "results.json").is_file():
            p.error(f"{run}: no results.json (a `primal bench --out` folder?)")
    rows = compare(a.before, a.after)
    if not rows:
        p.error("no cell was measured on both sides")
    print(table(rows))
    if a.out:
        a.out.write_text(json.dumps({"before": [str(x) for x in a.before], "after": [str(x) for x in a.after],
                                     "rows": rows}, indent=1))
        print(f"json: {a.out}")


if __name__ == "__main__":
    main()

"""A benchmark run's files: results.json (records and analysis), results.md (the tables) and the PNG
plots; loading runs back and merging runs of disjoint grids."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from primal_attention.bench.analysis import Record, analyse
from primal_attention.bench.plots import plot
from primal_attention.bench.tables import markdown


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

"""Tuned comparisons for the results pages: each model's sweep (grid, choice on validation, final seeds),
the trivial baselines on the same splits, and every model's difference from the reference model with
its 95 % interval.

The results scripts name their comparisons (which configs, which sweep stores) and call
:func:`tuned_section` for a page; nothing here trains.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primal_attention.train.stats import value_cell, welch_difference
from primal_attention.train.sweep import grid_points

__all__ = ["CLAIM_DIRECTIONS", "Entry", "Outcome", "at_grid_edge", "baselines_for", "below_baseline", "best_baseline",
           "clears_baseline", "display_digits", "display_scale", "late_gains", "no_verdict", "outcome", "still_improving", "tuned_section",
           "verdict_against_claim"]


@dataclass(frozen=True)
class Entry:
    """One model of a comparison: its label, config and sweep store (``primal sweep --store``)."""

    label: str
    config: Path
    store: Path


@dataclass
class Outcome:
    """What a model's sweep gave: the metric, the grid's validation values, the choice, and the final
    seeds' val-selected / best / final test values and histories."""

    entry: Entry
    metric: str
    maximize: bool
    points: list[dict[str, Any]]
    chosen: dict[str, Any] | None
    test: list[float]
    best_test: list[float]
    final_test: list[float]
    histories: list[list[dict[str, float]]]
    grid: dict[str, list[Any]]

    @property
    def grid_size(self) -> int:
        return math.prod(len(values) for values in self.grid.values())


def outcome(entry: Entry) -> Outcome | None:
    """The stored state of ``entry``'s sweep, or None if it has not started."""
    path = entry.store / "sweep.json"
    if not path.is_file():
        return None
    rep = json.loads(path.read_text())
    metric = rep["selection"]["metric"].removeprefix("val_")
    from primal_attention.train.sweep import point_name

    folder = None if rep["chosen"] is None else entry.store / "final" / point_name(rep["chosen"])
    # only the sweep's final seeds: a file of another seed (an earlier protocol's reused sweep run) is not one
    finals = [] if folder is None else \
        [json.loads(p.read_text()) for s in rep["final_seeds"] if (p := folder / f"seed_{s}.json").is_file()]
    take = lambda key: [float(f[key]) for f in finals if key in f]  # noqa: E731
    return Outcome(entry, metric, rep["selection"]["maximize"], rep["points"], rep["chosen"], take(f"test_{metric}"),
                   take(f"best_test_{metric}"), take(f"final_test_{metric}"), [f.get("history", []) for f in finals],
                   rep["grid"])


#: what the trivial baselines include; a cache of another version is recomputed (2: the linear baseline;
#: 3: its regularisation grid widened past an edge while the choice lies there; 4: each seed's choice kept).
BASELINES_VERSION = 4


def baselines_for(config: Path, seeds: Sequence[int], cache: Path, overrides: Sequence[str] = (), *,
                  compute: bool = True, data_key: Any = None) -> dict[str, Any]:
    """Trivial baselines of ``config`` on the holdout splits of each seed (computed once, kept in ``cache``):
    ``{name: {"what": ..., "val_<m>": [per seed], "test_<m>": [per seed]}}``. With ``compute`` False a
    seed the cache lacks (or a cache of another version) is a LookupError instead of a computation
    (pages render from what is stored; computing needs the data). ``data_key`` names the data (e.g. a
    collection's statistics): a cache of other data is stale; None (the data unknown here) accepts any."""
    stored = json.loads(cache.read_text()) if cache.is_file() else {}
    if stored.get("overrides") != list(overrides) or stored.get("version") != BASELINES_VERSION \
            or (data_key is not None and stored.get("data_key") != data_key):
        stored = {}
    known = stored.get("seeds", [])
    from primal_attention.train.load import load_config
    from primal_attention.provenance import shown_path
    from primal_attention.train.trivial import trivial_baselines

    cfg = None
    merged: dict[str, Any] = {}
    for seed in seeds:
        if seed in known:  # each seed's split is computed once, whatever other seeds are asked for later
            i = known.index(seed)
            rows = {name: {k: (v if k == "what" else v[i]) for k, v in row.items()} for name, row in stored["baselines"].items()}
        else:
            if not compute:
                raise LookupError(f"{cache}: no baselines of seed {seed} (version {BASELINES_VERSION}) stored")
            cfg = cfg or load_config(config, list(overrides))
            rows = trivial_baselines(cfg, seed=seed)
        for name, row in rows.items():
            slot = merged.setdefault(name, {"what": row["what"]})
            for key, value in row.items():
                if key != "what":
                    slot.setdefault(key, []).append(value)
    if list(seeds) != known:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"config": shown_path(config), "seeds": list(seeds), "overrides": list(overrides),
                                     "version": BASELINES_VERSION, "data_key": data_key if data_key is not None
                                     else stored.get("data_key"), "baselines": merged}, indent=2) + "\n")
    return merged


def baseline_what(row: dict[str, Any]) -> str:
    """A stored baseline's description with what each seed chose where it chose a regularisation on validation
    (``choice`` and ``tried`` per seed), e.g. ``"…; chosen per seed: 0.001, 0.01, 0.001"``, counting the seeds
    whose choice stayed at the edge of what was tried."""
    from primal_attention.train.trivial import at_edge

    choices = row.get("choice")
    if not choices:
        return row["what"]
    text = f"{row['what']}; chosen per seed: {', '.join(f'{c:g}' for c in choices)}"
    edges = sum(at_edge(t, c) for c, t in zip(choices, row.get("tried", [])))
    return text + (f" ({edges} of {len(choices)} still at the edge of what was tried)" if edges else "")


def display_scale(metric: str) -> float:
    """The factor a metric is shown with: accuracy in %, everything else as it is."""
    return 100.0 if metric == "acc" else 1.0


def display_digits(metric: str) -> int:
    """Decimals shown: accuracy in % and RL's normalised score to 0.1, other metrics (a loss) to 0.001."""
    return 1 if metric in ("acc", "score") else 3


#: the share of a schedule's validation evaluations, at its end, that a curve still improving reaches a new best in
LATE_SHARE = 0.25


def late_gains(o: Outcome) -> list[float]:
    """Per final seed with a history, in the metric's good direction and display units: the best validation
    value of the last quarter of the evaluations (at least the last one) minus the best before it; > 0: the
    curve was still improving at the end of the schedule (the decay ending it, not a plateau)."""
    key, s = f"val_{o.metric}", display_scale(o.metric)
    sign = 1.0 if o.maximize else -1.0
    gains = []
    for h in o.histories:
        if not h or key not in h[-1]:
            continue
        values = [sign * row[key] for row in h if key in row]
        late = min(max(1, math.ceil(LATE_SHARE * len(values))), len(values) - 1)
        # a single evaluation has nothing before it: counted as still improving (nothing shows a plateau)
        gains.append(math.inf if late < 1 else s * (max(values[-late:]) - max(values[:-late])))
    return gains


def still_improving(o: Outcome) -> tuple[int, int]:
    """(k, n): in k of the n final seeds with a history, the last quarter of the schedule's validation
    evaluations reached a new best, above every earlier one (the curve had not flattened)."""
    gains = late_gains(o)
    return sum(g > 0 for g in gains), len(gains)


def _late_gain_text(o: Outcome) -> str:
    """The mean late gain of the seeds still improving, e.g. ``+2.5``."""
    gains = [g for g in late_gains(o) if 0 < g < math.inf]
    return f", {statistics.mean(gains):+.{display_digits(o.metric)}f}" if gains else ""


def best_baseline(baselines: dict[str, Any], metric: str, maximize: bool) -> tuple[float, str] | None:
    """(mean test value, name) of the best trivial baseline in ``baselines`` (``{name: {"test_<metric>": [...]}}``),
    None where none has a test value."""
    key = f"test_{metric}"
    rows = [(statistics.mean(r[key]), name) for name, r in baselines.items() if r.get(key)]
    if not rows:
        return None
    return max(rows) if maximize else min(rows)


def no_verdict(values: dict[str, Sequence[float]], reference: str, best: float | None, maximize: bool) -> str | None:
    """Why a difference from ``reference`` is no verdict, on the values per model (models with fewer than
    two seeds not counted) and the best trivial baseline ``best`` (same units): "no signal on this budget"
    where no model is clearly above it (:func:`clears_baseline`), "no fair verdict: the <reference> is not
    above a trivial baseline" where the reference is not; None where the difference is a verdict."""
    if best is None:
        return None
    clear = {label: clears_baseline(v, best, maximize) for label, v in values.items() if len(v) >= 2}
    if not any(clear.values()):
        return "no signal on this budget" if clear else None
    if not clear.get(reference, True):
        return f"no fair verdict: the {reference} is not above a trivial baseline"
    return None


def _flattened(o: Outcome) -> str:
    """Whether the selected validation curve had flattened, as a table cell."""
    rising, n = still_improving(o)
    if not n:
        return "–"
    return f"{n}/{n} flat" if not rising else f"{rising}/{n} still improving"


def _grid_cell(o: Outcome) -> str:
    key, s = f"val_{o.metric}", display_scale(o.metric)
    run = {json.dumps(p["point"], sort_keys=True): p for p in o.points}
    order = [json.dumps(p, sort_keys=True) for p in grid_points(o.grid)]
    parts = []
    for name in order + [n for n in run if n not in order]:  # the grid's order; a not yet run point shows –
        value = ", ".join(f"{v:g}" for v in json.loads(name).values())
        text = f"{value}: {s * run[name][key]:.{display_digits(o.metric)}f}" if name in run else f"{value}: –"
        parts.append(f"**{text}**" if name in run and run[name]["point"] == o.chosen else text)
    left = o.grid_size - len(o.points)
    return " · ".join(parts) + (f" ({left} left)" if left else "")


def tuned_section(entries: Sequence[Entry], baselines: dict[str, Any], *, reference: str,
                  swept: str = "optim.lr", metric: str = "acc", pending: str | None = None) -> list[str]:
    """Markdown lines: one row per model (validation value of each grid point, the choice in bold; final
    seeds' val-selected, best and final test; the difference from ``reference`` with its Welch 95 %
    interval; whether the selected validation curve flattened), then the trivial baselines, then
    flags for models not above the best trivial baseline. ``metric``: the selection metric to show
    before any sweep has stored a point (after that, the sweeps' own). ``pending``: why this comparison gives
    no verdict whatever its values (a longer one it needs is unfinished): its differences carry no direction."""
    outcomes = {e.label: outcome(e) for e in entries}
    known = [o for o in outcomes.values() if o is not None]
    metric = known[0].metric if known else metric
    s, k = display_scale(metric), display_digits(metric)
    ref = outcomes.get(reference)
    lines = [f"| model | validation {metric} per {swept} (chosen in bold) | n | test (val-selected) | best test | "
             f"final test | Δ vs {reference}, 95 % CI | selected curve |", "|---|---|---|---|---|---|---|---|"]
    power: list[str] = []
    maximize = known[0].maximize if known else True
    base = best_baseline(baselines, metric, maximize)
    why = f"no fair verdict: {pending}" if pending else \
        no_verdict({o.entry.label: o.test for o in known}, reference, None if base is None else base[0], maximize)
    for e in entries:
        o = outcomes[e.label]
        if o is None:
            lines.append(f"| {e.label} | not run yet | 0 | – | – | – | – | – |")
            continue
        diff = "–"
        if e.label != reference and ref is not None and o.test and ref.test:
            d = welch_difference([s * v for v in o.test], [s * v for v in ref.test], maximize=o.maximize)
            diff = d.cell(digits=k, directed=why is None)
            if not math.isnan(d.low):
                found = d.detectable()
                power.append(f"{e.label} ±{(d.high - d.low) / 2:.{k}f} (80 % power: "
                             + (f"{found:.{k}f})" if found > 0 else "–, every seed of both gave the same value)"))
        lines.append(f"| {e.label} | {_grid_cell(o)} | {len(o.test)} | {value_cell([s * v for v in o.test], k)} | "
                     f"{value_cell([s * v for v in o.best_test], k)} | {value_cell([s * v for v in o.final_test], k)} | "
                     f"{diff} | {_flattened(o)} |")
    for name, row in baselines.items():
        test = row.get(f"test_{metric}", [])
        lines.append(f"| *trivial: {name}* ({baseline_what(row)}) | – | {len(test)} | {value_cell([s * v for v in test], k)} "
                     "| – | – | – | – |")
    if any(o.test and not o.best_test for o in known):
        lines += ["", "*best test* and *final test* are – where the runs scored TEST once, with the val-selected "
                      "weights (`train.track_test` off), so no test value exists at the other evaluations."]
    if power:
        lines += ["", "**Smallest detectable difference** (±: half the width of the 95 % interval, so an observed "
                      "difference inside it reads as *within noise*; a true difference of that size is found only about "
                      "half the time, and the 80 % power figure is the true difference these seeds find 4 times in 5, "
                      f"taking the observed spread as the true one): {'; '.join(power)}."]
    flags = below_baseline(entries, baselines)
    if flags:
        lines += ["", "**At or below a trivial baseline** (mean val-selected test within one std of, or under, the best "
                      "trivial baseline): " + "; ".join(flags) + "."]
    if why is not None:
        lines += ["", f"**No verdict: {why.removeprefix('no fair verdict: ')}** (the differences are shown without a "
                      "direction: *excludes 0* where the interval does)."]
    rising = [f"{label} ({up}/{n} seeds{_late_gain_text(o)})" for label, o in outcomes.items() if o is not None
              for up, n in [still_improving(o)] if up]
    reference_clears = base is not None and ref is not None and len(ref.test) >= 2 and \
        clears_baseline(ref.test, base[0], maximize)
    if rising:
        trend = "still rising" if known[0].maximize else f"{metric} still falling"  # a loss improves downwards
        lines += ["", f"**Validation {trend} at the end of the schedule** (a new best in the last quarter of the "
                      "evaluations, rounded up: the last 1 of 2 to 4, 2 of 5 to 8, 3 of 9 to 12; beyond every "
                      "earlier one; the mean gain over the earlier best shown): " + "; ".join(rising)
                      + ". The comparison holds for this budget only; a longer schedule may change it"
                      + (f" (its differences are read as a verdict because the {reference} is above every trivial "
                         f"baseline, best {base[1]} {s * base[0]:.{k}f}: a schedule still improving gives a verdict "
                         "only then)." if why is None and reference_clears else ".")]
    ties = [f"{label} ({tie})" for label, o in outcomes.items() if o is not None and (tie := tied_choice(o))]
    if ties:
        rule = ("the earlier grid point" if metric == "loss" else "the lower validation loss at each run's selected "
                "evaluation, the first to reach its best,")
        lines += ["", f"**Chosen by the tie-break** (grid points that tie at the best validation value: {rule} picks "
                      "among them): " + "; ".join(ties) + "."]
    edges = [f"{label} ({edge})" for label, o in outcomes.items() if o is not None and (edge := at_grid_edge(o))]
    if edges:
        lines += ["", "**Chosen at the edge of the grid** (the best value may lie outside it; a grid is widened "
                      "one step at a time, the same for every model of the comparison, until every choice is interior "
                      "or four steps were added on a side): " + "; ".join(edges) + "."]
    return lines


def tied_choice(o: Outcome) -> str:
    """How many grid points share the chosen point's validation value, e.g. ``"4 of 5 points at 100.0"``; "" where
    the choice is not tied (or not made)."""
    if o.chosen is None:
        return ""
    key = f"val_{o.metric}"
    best = next(p[key] for p in o.points if p["point"] == o.chosen)
    tied = sum(p[key] == best for p in o.points)
    if tied < 2:
        return ""
    return f"{tied} of {len(o.points)} points at {display_scale(o.metric) * best:.{display_digits(o.metric)}f}"


def at_grid_edge(o: Outcome) -> str:
    """Which swept keys the finished grid's choice puts at their smallest or largest value (numeric keys of
    two values or more: a two-value grid has no inside, so its choice is always an edge, which a widened grid
    then resolves), e.g. ``"optim.lr 0.003, the largest"``; "" if none or not finished."""
    if o.chosen is None or len(o.points) < o.grid_size:
        return ""
    out = []
    for key, values in o.grid.items():
        if len(values) < 2 or not all(isinstance(v, int | float) for v in values) or key not in o.chosen:
            continue
        if o.chosen[key] == min(values):
            out.append(f"{key} {o.chosen[key]:g}, the smallest")
        elif o.chosen[key] == max(values):
            out.append(f"{key} {o.chosen[key]:g}, the largest")
    return "; ".join(out)


def clears_baseline(values: Sequence[float], best: float, maximize: bool) -> bool:
    """Whether the mean of ``values`` lies beyond ``best`` (the best trivial baseline) by more than one
    sample std (no spread for a single value), in the metric's good direction."""
    mean = statistics.mean(values)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean - spread > best if maximize else mean + spread < best


def below_baseline(entries: Sequence[Entry], baselines: dict[str, Any]) -> list[str]:
    """Models whose mean val-selected test is not clearly above the best trivial baseline."""
    out = []
    for e in entries:
        o = outcome(e)
        if o is None or not o.test or (base := best_baseline(baselines, o.metric, o.maximize)) is None:
            continue
        best, name = base
        if not clears_baseline(o.test, best, o.maximize):
            s = display_scale(o.metric)
            k = display_digits(o.metric)
            out.append(f"{e.label} ({s * statistics.mean(o.test):.{k}f} vs {name} {s * best:.{k}f})")
    return out


#: what a paper's claim can say of a primal model against the Transformer.
CLAIM_DIRECTIONS = ("better", "parity", "worse")


def verdict_against_claim(measured: str, claimed: str | None) -> str:
    """A verdict word from what was measured (a :class:`~primal_attention.train.stats.Difference`'s verdict:
    "better", "within noise" or "worse") and what the paper claims (one of CLAIM_DIRECTIONS, or None where
    the paper makes no claim): "reproduced (parity)", "not reproduced (better; the paper: parity)",
    "worse (no claim in the paper)"."""
    found = {"better": "better", "within noise": "parity", "worse": "worse"}[measured]
    if claimed is None:
        return f"{found} (no claim in the paper)"
    if claimed not in CLAIM_DIRECTIONS:
        raise ValueError(f"claimed must be one of {', '.join(CLAIM_DIRECTIONS)} or None, got {claimed!r}")
    if found == claimed:
        return f"reproduced ({found})"
    return f"not reproduced ({found}; the paper: {claimed})"

"""Regenerate docs/results/README.md: every system on one page — the paper's claim, our measurement with
its interval, the best trivial baseline, and a verdict.

A system's row uses its tuned comparison (per-model learning rate selected on validation, 3 seeds;
``scripts/sweep_comparisons.py``) once both sides have two or more final seeds; until then the earlier
runs (one shared learning rate, the previous init) are shown, labelled as such. Trivial baselines come
from docs/results/baselines/ (computed on the same holdout splits; ``--baselines`` computes the missing
ones where the data is on this machine).

    .venv/bin/python scripts/results_summary.py
    .venv/bin/python scripts/results_summary.py --baselines     # also compute missing trivial baselines
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primal_attention.studies import sweeps as tuned
from primal_attention.studies.paths import ROOT

from primal_attention.studies.comparison import (
    Outcome, at_grid_edge, baselines_for, clears_baseline, display_scale, no_verdict, outcome, still_improving,
    verdict_against_claim)
from primal_attention.train.stats import value_cell, welch_difference

RESULTS = ROOT / "docs" / "results"
PAGE = RESULTS / "README.md"
MODELS = ("PrimalFormer", "Primal.+Trans.")
RL_DATASETS = [f"{e}-{d}" for e in ("hopper", "halfcheetah", "walker2d") for d in ("medium", "medium-replay", "medium-expert")]


@dataclass
class System:
    """One row group: ``old`` maps a model label to the earlier runs' folders (their seed_*.json);
    ``paper`` the paper's numbers where our data is the paper's task."""

    name: str
    page: str
    metric: str
    maximize: bool
    old: dict[str, list[Path]]
    tuned: str | None = None
    paper: dict[str, float] = field(default_factory=dict)
    data: str = ""
    baseline_config: str | None = None
    baseline_file: str | None = None
    #: where the tuned values come from when it is not one comparison (RL: the mean over its datasets)
    tuned_values: Callable[[], dict[str, list[float]] | None] | None = None
    #: the trivial baseline of the tuned values where their data is not the earlier runs' (RL: re-collected)
    tuned_baseline: Callable[[], tuple[str, float] | None] | None = None
    #: the tuned comparisons behind ``tuned_values`` (RL: one per dataset), to say how far they are while the
    #: earlier runs still fill the row
    parts: list[str] = field(default_factory=list)
    #: the initialisation of the tuned runs, as the source column names it
    init: str = "authors' init"
    #: whether the earlier runs already had that initialisation (else they are the previous init's)
    earlier_same_init: bool = False
    #: what the source column adds after the tuned values' protocol (e.g. which datasets they average)
    tuned_note: Callable[[], str] | None = None
    #: a row shown only while it has tuned values (no earlier runs of its own)
    only_tuned: bool = False
    #: the same comparison on a longer schedule (or more data), and what it changes: it fills the row once
    #: complete; until then the row says how far it is
    longer: str | None = None
    longer_what: str = ""
    #: why the row needs the longer comparison
    longer_why: str = ""


def _comparison(system: System) -> str | None:
    """The comparison that fills a row: the longer one once complete, else the tuned one."""
    if system.longer and tuned.progress(system.longer) == "complete":
        return system.longer
    return system.tuned


def _longer_note(system: System) -> str:
    """The source column's word on the longer comparison: which one fills the row, or how far it is."""
    if not system.longer:
        return ""
    if _comparison(system) == system.longer:
        return f"; {system.longer_what} (`{system.longer}`)"
    runs, hours, _ = tuned.remaining(system.longer)
    cost = "" if hours is None else f", ≈ {hours:.0f} CPU h"
    return (f"; {system.longer_what} (`{system.longer}`): {tuned.progress(system.longer)}, {runs} runs left{cost} "
            f"(a verdict needs it: {system.longer_why}), on {system.page}")


def _lra(task: str, data: str, paper: dict[str, float] | None = None, longer: tuple[str, ...] | None = None) -> System:
    old = {label: [RESULTS / "lra_runs" / f"{task}_{kind}_cpu"] for kind, label in
           (("transformer", "Transformer"), ("primalformer", "PrimalFormer"), ("primal+", "Primal.+Trans."))}
    comparison = f"lra/{task}" if f"lra/{task}" in tuned.COMPARISONS else None
    return System(f"LRA {task}", "lra.md", "acc", True, old, comparison, paper or {}, data,
                  f"lra/{task}_transformer_cpu", f"lra_{task}.json", **_longer(*(longer or (None, ""))))


def _longer(comparison: str | None, what: str) -> dict[str, Any]:
    """System fields of a longer comparison (none where it is not registered)."""
    if comparison not in tuned.COMPARISONS:
        return {}
    return {"longer": comparison, "longer_what": what, "longer_why": tuned.NEEDED_BECAUSE[comparison]}


def _uea(name: str, data: str, paper: dict[str, float] | None = None) -> System:
    old = {label: [RESULTS / "uea_runs" / f"{name}_{kind}" / "holdout"] for kind, label in
           (("transformer", "Transformer"), ("primalformer", "PrimalFormer"), ("primal+", "Primal.+Trans."))}
    comparison = f"uea/{name}" if f"uea/{name}" in tuned.COMPARISONS else None
    return System(f"UEA {name}", "uea.md", "acc", True, old, comparison, paper or {}, data,
                  f"uea/{name}_transformer", f"uea_{name}.json")


SYSTEMS = [
    _lra("listops", "our generator, 100-500 tokens (the paper's task at 500-2000)",
         longer=("lra/listops-96k", "the authors' amount of data, 96K training examples at 50-200 tokens")),
    _lra("image", "Fashion-MNIST stand-in (paper: CIFAR-10)", longer=("lra/image-4x", "4× the steps")),
    _lra("text", "IMDB (Pang & Lee) stand-in, 1000 bytes"),
    _lra("retrieval", "Shakespeare / Bible pairs stand-in"),
    _lra("pathfinder", "our generator (paper: LRA's images)"),
    _uea("JapaneseVowels", "real UEA data (the paper's dataset)",
         {"Transformer": 98.7, "PrimalFormer": 98.4, "Primal.+Trans.": 98.9}),
    _uea("BasicMotions", "real UEA data (not in the paper)"),
    _uea("FSDD", "FSDD MFCCs stand-in (paper: SpokenArabicDigits)"),
    System("Vision", "vision.md", "acc", True,
           {label: [RESULTS / "vision_runs" / f"fmnist_{kind}"] for kind, label in
            (("vit", "Transformer"), ("primalformer", "PrimalFormer"), ("primal+", "Primal.+Trans."))},
           "vision/fmnist", {}, "Fashion-MNIST ViT stand-in (paper: ImageNet DeiT-S)", "vision/fmnist_vit",
           "vision_fmnist.json", init="init unchanged (its departures from the authors' in docs/method.md §8)",
           earlier_same_init=True, **_longer("vision/fmnist-30ep", "30 epochs")),
    System("Causal LM", "lm.md", "ppl", False,
           {label: [RESULTS / "lm_runs" / f"corpora_{kind}"] for kind, label in
            (("transformer", "Transformer"), ("primalformer", "PrimalFormer"), ("primal+", "Primal.+Trans."))},
           "lm/corpora" if "lm/corpora" in tuned.COMPARISONS else None, {},
           "Shakespeare / Milton / Bible stand-in (paper: WikiText-103)", "lm/corpora_transformer",
           "lm_corpora.json", init="init unchanged (its departures from the authors' in docs/method.md §8)",
           earlier_same_init=True,
           **_longer("lm/corpora-4x", "4× the steps from every model's two best rates")),
    System("Offline RL (9-dataset mean)", "rl.md", "score", True,
           {"Transformer": [RESULTS / "rl_runs" / f"{d}_dt" for d in RL_DATASETS],
            "Primal.+Trans.": [RESULTS / "rl_runs" / f"{d}_primal+" for d in RL_DATASETS]},
           None, {}, "SAC-collected MuJoCo datasets (paper: D4RL)", None, "rl_behaviour.json",
           lambda: _renamed(tuned.rl_average(), _RL_NAMES),
           lambda: _rl_collected_baseline(), [f"rl/{d}" for d in RL_DATASETS]),
    System("Offline RL (tuned datasets so far)", "rl.md", "score", True, {}, None, {},
           "SAC-collected MuJoCo datasets (paper: D4RL), those whose tuned comparison is complete", None, None,
           lambda: _renamed(tuned.rl_average(ds), _RL_NAMES) if (ds := _rl_complete()) else None,
           lambda: _rl_collected_baseline(ds) if (ds := _rl_complete()) else None,
           tuned_note=lambda: f"; the mean over {', '.join(ds := _rl_complete())}, per seed" + _rl_rising(ds),
           only_tuned=True),
]
#: the paper's claim per system, as a phrase (docs/method.md §5).
CLAIMS = {
    "LRA listops": "PrimalFormer 37.3, Primal.+Trans. 37.3 vs Transformer 37.1 (parity)",
    "LRA image": "43.0 / 43.9 vs 38.2 (better)",
    "LRA text": "61.2 / 65.4 vs 65.0 (PrimalFormer worse, Primal.+Trans. parity)",
    "LRA retrieval": "77.8 / 81.0 vs 79.4 (PrimalFormer worse, Primal.+Trans. better)",
    "LRA pathfinder": "68.3 / 74.3 vs 74.2 (PrimalFormer worse, Primal.+Trans. parity)",
    "UEA JapaneseVowels": "98.4 / 98.9 vs 98.7 (parity)",
    "UEA BasicMotions": "– (not in the paper)",
    "UEA FSDD": "– (stand-in; UEA average 73.0 / 73.1 vs 71.9)",
    "Vision": "Primal.+DeiT 79.8 vs DeiT 79.8 (parity)",
    "Causal LM": "Primal.+Trans. ppl 31.0 vs 33.0 (better)",
    "Offline RL (9-dataset mean)": "Primal.+DT 77.5 vs DT 72.2 (better)",
    "Offline RL (tuned datasets so far)": "– (the paper's figure is the 9-dataset mean above)",
}
#: the direction each claim gives a primal model against the Transformer (None: the paper has no such row): the
#: paper gives single numbers without intervals, so a difference under 1 point is read as parity (docs/method.md §5).
CLAIMED = {
    "LRA listops": {"PrimalFormer": "parity", "Primal.+Trans.": "parity"},
    "LRA image": {"PrimalFormer": "better", "Primal.+Trans.": "better"},
    "LRA text": {"PrimalFormer": "worse", "Primal.+Trans.": "parity"},
    "LRA retrieval": {"PrimalFormer": "worse", "Primal.+Trans.": "better"},
    "LRA pathfinder": {"PrimalFormer": "worse", "Primal.+Trans.": "parity"},
    "UEA JapaneseVowels": {"PrimalFormer": "parity", "Primal.+Trans.": "parity"},
    "Vision": {"Primal.+Trans.": "parity"},
    "Causal LM": {"Primal.+Trans.": "better"},
    "Offline RL (9-dataset mean)": {"Primal.+Trans.": "better"},
}


_RL_NAMES = {"DT": "Transformer", "Primal.+DT": "Primal.+Trans."}


def _shown(system: System, label: str) -> str:
    """A model's name in ``system``'s rows: the RL rows name the Decision Transformers as rl.md does."""
    return {v: k for k, v in _RL_NAMES.items()}.get(label, label) if system.name.startswith("Offline RL") else label


def _rl_rising(datasets: list[str]) -> str:
    """How many final seeds of each model were still improving at the schedule's end, per dataset (in the
    order of ``datasets``), e.g. ``"; validation still improving … (seeds, per dataset): DT 3/3, 1/3"``; "" if none."""
    counts: dict[str, list[str]] = {}
    for d in datasets:
        for e in tuned.entries(f"rl/{d}"):
            o = outcome(e)
            k, n = still_improving(o) if o is not None else (0, 0)
            counts.setdefault(e.label, []).append(f"{k}/{n}")
    if all(c.startswith("0/") for row in counts.values() for c in row):
        return ""
    return ("; validation still improving at the schedule's end (seeds, per dataset): "
            + "; ".join(f"{label} {', '.join(row)}" for label, row in counts.items()))


def _rl_complete() -> list[str]:
    """The RL datasets whose tuned comparison is complete, while some are not (all complete: [], the
    9-dataset row then has them)."""
    done = [d for d in RL_DATASETS if tuned.progress(f"rl/{d}") == "complete"]
    return done if len(done) < len(RL_DATASETS) else []


def _rl_collected_baseline(datasets: list[str] | None = None) -> tuple[str, float] | None:
    """The best trivial baseline of the mean over ``datasets`` (default all nine): per dataset the better of the
    behaviour policy (from the cards of the data the tuned runs used; None until every one's is recorded) and
    the linear policy where it is stored, averaged; named after the one that won everywhere, else "best of
    behaviour / linear per dataset"."""
    datasets = RL_DATASETS if datasets is None else datasets
    scores = tuned.collected_behaviour()
    if not all(d in scores for d in datasets):
        return None
    best = []
    for d in datasets:
        linear = tuned.rl_linear_baseline(f"rl/{d}", compute=False)
        options = [("behaviour", scores[d])] + ([("linear", linear["test_score"][0])] if linear else [])
        best.append(max(options, key=lambda o: o[1]))
    names = {name for name, _ in best}
    name = names.pop() if len(names) == 1 else "best of behaviour / linear per dataset"
    mean = statistics.mean(value for _, value in best)
    return f"{name} {mean:.1f}", mean


def _renamed(values: dict[str, list[float]] | None, names: dict[str, str]) -> dict[str, list[float]] | None:
    return None if values is None else {names.get(k, k): v for k, v in values.items()}


def _per_seed(system: System, label: str) -> list[float]:
    """The old runs' val-selected test metric per seed (RL: the mean over the datasets of each seed)."""
    folders = system.old.get(label, [])
    key = f"test_{system.metric}"
    by_seed: dict[int, list[float]] = {}
    for folder in folders:
        for p in sorted(folder.glob("seed_*.json")):
            r = json.loads(p.read_text())
            if key in r:
                by_seed.setdefault(int(r["seed"]), []).append(float(r[key]))
    complete = [v for v in by_seed.values() if len(v) == len(folders)]
    return [statistics.mean(v) for v in complete]


def _baseline(system: System, compute: bool) -> tuple[str, float | None]:
    """(cell text, best mean) of the best trivial baseline for the system's metric."""
    path = RESULTS / "baselines" / system.baseline_file if system.baseline_file else None
    rows = None
    if _comparison(system):
        try:
            rows = tuned.baselines(_comparison(system), compute=compute) if compute or _cached(system) else None
        except LookupError:
            rows = None  # stored for other seeds or an older version: "not computed yet" until --baselines
        except Exception as err:  # noqa: BLE001 - the page says why, the rest of it still renders
            return f"not computed ({type(err).__name__})", None
    elif path is not None and (path.is_file() or (compute and system.baseline_config)):
        try:
            rows = baselines_for(ROOT / "configs" / f"{system.baseline_config}.yaml", tuned.FINAL_SEEDS, path) \
                if system.baseline_config else json.loads(path.read_text())["baselines"]
        except Exception as err:  # noqa: BLE001
            return f"not computed ({type(err).__name__})", None
    if not rows:
        return "not computed yet", None
    key = f"test_{system.metric}"
    scored = [(statistics.mean(r[key]), name) for name, r in rows.items() if r.get(key)]
    if not scored:
        return "–", None
    best, name = max(scored) if system.maximize else min(scored)
    scale = 100.0 if system.metric == "acc" else 1.0
    return f"{name} {scale * best:.1f}", scale * best


def _cached(system: System) -> bool:
    return (RESULTS / "baselines" / f"{_comparison(system).replace('/', '_')}.json").is_file()


def _values(system: System) -> tuple[dict[str, list[float]], str, bool]:
    """Per-model values (in display units) and which protocol they come from."""
    values = system.tuned_values() if system.tuned_values else None
    if values:
        return values, f"{TUNED}, {system.init}" + (system.tuned_note() if system.tuned_note else ""), True
    if _comparison(system) and (found := _comparison_values(system, _comparison(system))):
        values, outs = found
        rising = [f"{label} {k}/{n}" for label, o in outs.items() for k, n in [still_improving(o)] if k]
        note = f"; validation still improving at the schedule's end (seeds): {', '.join(rising)}" if rising else ""
        edges = [f"{label} ({edge})" for label, o in outs.items() if (edge := at_grid_edge(o))]
        note += f"; chosen at the grid's edge: {', '.join(edges)}" if edges else ""
        return values, f"{TUNED}, {system.init}{note}{_longer_note(system)}", True
    return _earlier(system), earlier_label(system) + _parts_note(system) + _longer_note(system), False


def _comparison_values(system: System, comparison: str) -> tuple[dict[str, list[float]], dict[str, Outcome]] | None:
    """(per-model values in display units, the outcomes) of ``comparison`` once every model has two final seeds."""
    outs = {e.label: outcome(e) for e in tuned.entries(comparison)}
    ready = [o for o in outs.values() if o is not None and len(o.test) >= 2]
    if len(ready) != len(outs):
        return None
    # an LM sweep selects and stores the loss (nats per token); the page's metric is its exp, perplexity
    scale = display_scale(system.metric)
    convert = math.exp if system.metric == "ppl" and ready[0].metric == "loss" else (lambda v: scale * v)
    return {label: [convert(v) for v in o.test] for label, o in outs.items()}, outs


def _parts_note(system: System) -> str:
    """While the earlier runs fill a row whose tuned value needs several comparisons: how many are done."""
    states = {c.split("/", 1)[1]: tuned.progress(c) for c in system.parts}
    done = [name for name, state in states.items() if state == "complete"]
    started = [name for name, state in states.items() if state == "in progress"]
    if not done and not started:
        return ""
    return (f"; tuned comparison complete on {len(done)} of {len(system.parts)}"
            + (f" ({', '.join(done)})" if done else "") + (f", in progress on {', '.join(started)}" if started else "")
            + f", on {system.page}")


EARLIER = "earlier runs: shared lr, previous init"


def earlier_label(system: System) -> str:
    """How the source column names a row's earlier runs: one shared lr, and the previous init where it changed."""
    return "earlier runs: shared lr, init unchanged" if system.earlier_same_init else EARLIER


TUNED = "tuned lr (val-selected)"


def _earlier(system: System) -> dict[str, list[float]]:
    """Per-model values (display units) of the earlier runs: one shared learning rate, the previous init."""
    scale = 100.0 if system.metric == "acc" else 1.0
    return {label: [scale * v for v in _per_seed(system, label)] for label in system.old}


def _clears(values: list[float], best_baseline: float | None, maximize: bool) -> bool:
    """Whether the mean is beyond the best trivial baseline by more than one sample std (a single seed: its
    value beyond it; no baseline or no seed: nothing to flag)."""
    return best_baseline is None or not values or clears_baseline(values, best_baseline, maximize)


def _verdict(values: list[float], ref: list[float], best_baseline: float | None, maximize: bool,
             all_values: dict[str, list[float]], claimed: str | None, pending: str | None = None,
             digits: int = 1) -> tuple[str, str]:
    """(Δ cell to ``digits`` decimals, verdict word) of a primal model against the Transformer. ``pending``: why
    the row needs a comparison that has not finished (a longer schedule, more data): then it is no verdict either."""
    if len(values) < 2 or len(ref) < 2:
        return "–", "too few seeds"
    d = welch_difference(values, ref, maximize=maximize)
    if pending:
        why: str | None = f"no fair verdict: {pending}"
    elif best_baseline is None:
        why = "no verdict: trivial baselines not computed yet"
    else:
        why = no_verdict(all_values, "Transformer", best_baseline, maximize)
    if why is not None:  # the comparison says nothing about attention: the interval without better / worse
        return d.cell(digits=digits, directed=False), why
    return d.cell(digits=digits), verdict_against_claim(d.verdict, claimed)


def _pending(system: System) -> str | None:
    """Why the row is no verdict yet while its longer comparison is unfinished (None once it fills the row)."""
    return tuned.pending_longer(system.tuned) if system.tuned else None


def _changes(system: System, tuned_values: dict[str, list[float]], earlier: dict[str, list[float]],
             base: float | None, earlier_base: float | None) -> list[str]:
    """One line per model: earlier → tuned value, and for the primal models earlier → tuned verdict."""
    digits = 1 if system.metric != "ppl" else 2
    pending = _pending(system)
    # a row filled by its longer comparison: the tuned value on the earlier schedule comes between the two
    found = _comparison_values(system, system.tuned) if system.longer and _comparison(system) == system.longer else None
    same_schedule = found[0] if found else {}
    out = []
    for label in ("Transformer", *MODELS):
        if label not in tuned_values:
            continue
        before, after = earlier.get(label, []), tuned_values[label]
        middle = (f"{value_cell(same_schedule[label], digits)} (tuned, same schedule) → " if label in same_schedule
                  else "")
        line = (f"- {system.name}, {label}: {value_cell(before, digits) if before else '–'} → {middle}"
                f"{value_cell(after, digits)}" + (f" ({system.longer_what})" if middle else ""))
        if label != "Transformer":
            claimed = CLAIMED.get(system.name, {}).get(label)
            was_d, was = _verdict(before, earlier.get("Transformer", []), earlier_base, system.maximize, earlier, claimed,
                                  pending, digits)
            now_d, now = _verdict(after, tuned_values.get("Transformer", []), base, system.maximize, tuned_values, claimed,
                                  pending, digits)
            line += f"; Δ vs Transformer {was_d} → {now_d}"
            line += f"; no verdict until `{system.longer}` finishes" if pending else \
                f"; verdict: {was} → {now}" + ("" if was != now else " (unchanged)")
        out.append(line)
    return out


def _cell(values: list[float], digits: int, best_baseline: float | None, maximize: bool) -> str:
    flag = "" if _clears(values, best_baseline, maximize) else " ⚠ not above the trivial baseline"
    return f"{value_cell(values, digits)} (n={len(values)}){flag}"


def write_page(compute: bool) -> None:
    lines = [
        "# Results at a glance",
        "",
        "Regenerate: `.venv/bin/python scripts/results_summary.py` (`--baselines` computes missing trivial baselines).",
        "Every system of the paper on one page: the paper's claim, our measurement (val-selected test, mean ± sample",
        "std over seeds), the difference of each primal model from the Transformer with its **Welch 95 % interval**,",
        "the best **trivial baseline** on the same splits, and a verdict against the paper's claim for that model: we",
        "measure *better* or *worse* (the interval excludes 0) or *parity* (it contains 0), and call it *reproduced*",
        "when that is the paper's direction, *not reproduced* (with both directions) when it is not, and say *no",
        "claim in the paper* where the paper has no such row; or, first of all, *no fair verdict* while the longer",
        "schedule or larger data that the source column names as needed has not finished (the reason given); then",
        "*no signal on this budget* (no model clearly above the best trivial baseline, so the comparison says",
        "nothing about attention); then *no fair verdict* (the Transformer itself is not above a trivial baseline: it",
        "was starved, not beaten). In those cases the Δ column gives the interval without a direction (*excludes",
        "0*), since it is no verdict. A schedule whose validation curves still rise at its end (the source column",
        "says in how many seeds) gives a verdict only where the Transformer is above every trivial baseline, and",
        "that verdict holds for the budget, not for converged models. A row whose trivial baselines are not computed",
        "gives no verdict either (`--baselines` computes them), nor does a model with fewer than two seeds (*too few",
        "seeds*).",
        "⚠ marks a model whose mean is not above the best trivial baseline by more than one std (a single seed: not above it).",
        "Where a system's tuned comparison (each model's learning rate swept on the same budget and selected on",
        "validation, the authors' init where the source column says so; `scripts/sweep_comparisons.py`) is not",
        "finished, the earlier runs are shown and",
        "labelled *shared lr* (and *previous init* where the initialisation changed since): one learning rate for every",
        "model, which the audit found starved the Transformer on LRA. None of this is the paper's data or schedule except",
        "where the data column says so; the paper's numbers are a claim to compare the direction with, not a target (its",
        "direction: *parity* where its two numbers differ by less than 1 point, docs/method.md §5).",
        "",
        "| system | data | paper's claim | source | model | ours | Δ vs Transformer, 95 % CI | best trivial baseline | verdict | page |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    changed: list[str] = []
    same_init: list[str] = []  # the systems in ``changed`` whose earlier runs had the tuned runs' init
    for system in SYSTEMS:
        values, source, is_tuned = _values(system)
        if system.only_tuned and not is_tuned:
            continue
        base_text, base = _baseline(system, compute)
        earlier_base = base  # the earlier runs' data
        if is_tuned and system.tuned_baseline and (own := system.tuned_baseline()):
            base_text, base = own
        if is_tuned and system.old:
            same_init += [system.name] if system.earlier_same_init else []
            changed += _changes(system, values, _earlier(system), base, earlier_base)
        elif system.parts:  # the earlier runs' collections are not the re-collected data a linear policy is fit on
            linear = sum(tuned.rl_linear_baseline(c, compute=False) is not None for c in system.parts)
            base_text += (f" (a linear policy: only on the re-collected data, stored for {linear} of {len(system.parts)} "
                          f"datasets so far, on {system.page})")
        ref = values.get("Transformer", [])
        digits = 1 if system.metric != "ppl" else 2
        pending = _pending(system)
        lines.append(f"| {system.name} | {system.data} | {CLAIMS[system.name]} | {source} | {_shown(system, 'Transformer')} | "
                     f"{_cell(ref, digits, base, system.maximize)} | – | {base_text} | – | [{system.page}]({system.page}) |")
        for label in MODELS:
            if label not in values:
                continue
            diff, word = _verdict(values[label], ref, base, system.maximize, values,
                                  CLAIMED.get(system.name, {}).get(label), pending, digits)
            lines.append(f"| | | | | {_shown(system, label)} | {_cell(values[label], digits, base, system.maximize)} | {diff} | | "
                         f"{word} | |")
    lines += ["", "Metrics: accuracy % (LRA, UEA, vision), test perplexity per BPE token (LM, lower is better), "
                  "D4RL-normalised score (RL, the mean per seed over the 9 datasets, or over those named).", ""]
    if changed:
        lines += ["## What the tuned protocol changed", "",
                  "Each system shown above from its tuned comparison, against its earlier runs on the same data (one",
                  "shared lr; the previous init" + (f", except {' and '.join(same_init)}, whose init is unchanged"
                                                    if same_init else "")
                  + "; schedules on each page): every model's value and every primal model's verdict, earlier → tuned;",
                  "where a longer schedule fills the row, the tuned value on the earlier schedule comes between.", "",
                  *changed, ""]
    PAGE.write_text("\n".join(lines) + "\n")
    print(f"wrote {PAGE}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baselines", action="store_true", help="compute missing trivial baselines (needs the data)")
    write_page(p.parse_args().baselines)


if __name__ == "__main__":
    main()

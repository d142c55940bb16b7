"""The tuned comparisons behind docs/results: every model of every CPU comparison swept over the same
learning-rate grid on the same step budget, selected on validation, then trained with 3 seeds.

Each sweep is `primal sweep CONFIG --grid optim.lr=... --store docs/results/sweeps/<config>` (see
primal_attention.train.sweep): the small JSON results are committed under docs/results/sweeps/, the run
folders (checkpoints) live under runs/sweeps/ (git-ignored). Resumable at both levels, and any number of
copies of this script may run side by side (file locks per cell): a worker takes the first cell, in the
priority order below, that nobody holds, so a lone worker finishes one comparison before the next.

    .venv/bin/python scripts/sweep_comparisons.py                    # everything, in priority order
    .venv/bin/python scripts/sweep_comparisons.py --only lra/listops  # one comparison
    .venv/bin/python scripts/sweep_comparisons.py --list              # what is done, what is left (and
                                                                      # refresh each started sweep's sweep.json)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

from primal_attention.data.rl import D4RL_SCORES, DATASETS, dataset_file
from primal_attention.studies.comparison import (Entry, baselines_for, display_digits, display_scale, outcome,
                                             tuned_section)
from primal_attention.train.sweep import Sweep
from primal_attention.studies.paths import ROOT

STORE = ROOT / "docs" / "results" / "sweeps"
WORK = ROOT / "runs" / "sweeps"
#: one grid for every model: the authors' LRA lr (1e-4) up to 30x it. Where a model's choice on it lies at
#: an edge, every model of that comparison also gets the next value beyond that edge, until every choice is
#: interior (see grid_for).
GRID = {"optim.lr": [1e-4, 3e-4, 1e-3, 3e-3]}
#: comparison -> its configs (one per model); the issue's priority first: ListOps, Image, Fashion-MNIST
#: vision, JapaneseVowels; breadth after.
COMPARISONS = {
    "lra/listops": [f"lra/listops_{m}_cpu" for m in ("transformer", "primalformer", "primal+")],
    "lra/image": [f"lra/image_{m}_cpu" for m in ("transformer", "primalformer", "primal+")],
    "vision/fmnist": ["vision/fmnist_vit", "vision/fmnist_primalformer", "vision/fmnist_primal+"],
    "uea/JapaneseVowels": [f"uea/JapaneseVowels_{m}" for m in ("transformer", "primalformer", "primal+")],
    "uea/BasicMotions": [f"uea/BasicMotions_{m}" for m in ("transformer", "primalformer", "primal+")],
    "uea/FSDD": [f"uea/FSDD_{m}" for m in ("transformer", "primalformer", "primal+")],
    "lra/text": [f"lra/text_{m}_cpu" for m in ("transformer", "primalformer", "primal+")],
    "lra/retrieval": [f"lra/retrieval_{m}_cpu" for m in ("transformer", "primalformer", "primal+")],
    "lra/pathfinder": [f"lra/pathfinder_{m}_cpu" for m in ("transformer", "primalformer", "primal+")],
    # selected on validation loss (the LM task's selection metric; perplexity is its exp)
    "lm/corpora": [f"lm/corpora_{m}" for m in ("transformer", "primalformer", "primal+")],
}
#: the LM again at a 4x schedule (6000 steps, warmup and evaluations scaled alike) at the two best rates of
#: every model on the 1500-step grid (1e-2, 3e-3): does the ranking hold once validation flattens?
COMPARISONS["lm/corpora-4x"] = COMPARISONS["lm/corpora"]
#: schedules long enough to flatten, where the short one left the Transformer under the linear baseline with
#: curves still rising: LRA Image at 4x the steps and the Fashion-MNIST ViT at 30 epochs (6x), each at the two
#: best rates of every model on its short grid; ListOps with the authors' amount of data (96K training
#: examples, lengths 50-200 so that it fits the CPU), a new task, so swept on the full grid.
COMPARISONS["lra/image-4x"] = COMPARISONS["lra/image"]
COMPARISONS["vision/fmnist-30ep"] = COMPARISONS["vision/fmnist"]
COMPARISONS["lra/listops-96k"] = COMPARISONS["lra/listops"]
#: a comparison's own starting grid instead of GRID (the short schedule's two best rates: a confirmation, not
#: a search), widened like GRID when a choice lands at its edge
START_GRIDS: dict[str, dict[str, list[float]]] = {"lm/corpora-4x": {"optim.lr": [3e-3, 1e-2]},
                                                  "lra/image-4x": {"optim.lr": [3e-4, 1e-3]},
                                                  "vision/fmnist-30ep": {"optim.lr": [3e-3, 1e-2]}}
#: a longer comparison -> (its short one, the time of one of its runs over one of the short one's), for the
#: CPU estimate before any of its own runs exists (ListOps 96K: 4x the steps at 0.4x the length).
LONGER = {"lm/corpora-4x": ("lm/corpora", 4.0), "lra/image-4x": ("lra/image", 4.0),
          "vision/fmnist-30ep": ("vision/fmnist", 6.0), "lra/listops-96k": ("lra/listops", 1.6)}
#: why the short comparison of each longer one gives no verdict until the longer one is finished
NEEDED_BECAUSE = {"lm/corpora-4x": "this schedule leaves curves rising", "lra/image-4x": "this schedule leaves curves rising",
                  "vision/fmnist-30ep": "this schedule leaves curves rising",
                  "lra/listops-96k": "on 7.2K examples every model sits at the first-operator lookup"}
#: offline RL, one comparison per dataset (DT vs Primal.+DT); each needs its dataset collected first
#: (`primal data collect-rl ENV`), and a worker passes over those that are not.
RL_DATASETS = [f"{env}-{ds}" for env in D4RL_SCORES for ds in DATASETS]
COMPARISONS.update({f"rl/{d}": [f"rl/{d}_dt", f"rl/{d}_primal+"] for d in RL_DATASETS})
#: validation and test rollouts per evaluation of a tuned RL run (each split its own env seeds, disjoint:
#: train.families.rl.ROLLOUT_SEEDS). The first tuned round used RL_FIRST_ROUND_EPISODES, too few to select
#: on (its sweep's seed-0 run beat fresh seeds by up to 62 points); rl.md shows it beside this one.
RL_EVAL_EPISODES = 20
RL_FIRST_ROUND_EPISODES = 5
#: the CPU schedule of docs/results/rl.md (the paper's DT takes ~1.5 s per step on one core here).
RL_CPU_SCHEDULE = ["model.dim=128", "model.ffn_dim=512", "train.batch_size=32", "train.steps=1000",
                   "optim.warmup_steps=100", "train.eval_every=500", f"data.options.eval_episodes={RL_EVAL_EPISODES}"]
#: a comparison's stores (and run folders) are <config stem><suffix>, apart from another comparison's of the
#: same configs (a sweep's cells are keyed by grid point only, so a changed schedule needs its own store).
STORE_SUFFIX = {"lm/corpora-4x": "_4x", "lra/image-4x": "_4x", "vision/fmnist-30ep": "_30ep", "lra/listops-96k": "_96k",
                **{f"rl/{d}": f"_ep{RL_EVAL_EPISODES}" for d in RL_DATASETS}}
#: per-comparison overrides applied to every model and grid point alike (the UEA configs train 100
#: epochs under the authors' protocol; the holdout protocol is forced by the sweep itself).
#: BasicMotions keeps its earlier 30 epochs; FSDD (2000 clips) had 3, doubled here toward a flat validation curve.
OVERRIDES: dict[str, list[str]] = {"uea/JapaneseVowels": ["train.epochs=30"], "uea/BasicMotions": ["train.epochs=30"],
                                   "lm/corpora-4x": ["train.steps=6000", "optim.warmup_steps=800", "train.eval_every=500"],
                                   "uea/FSDD": ["train.epochs=6"], **{f"rl/{d}": RL_CPU_SCHEDULE for d in RL_DATASETS},
                                   "lra/image-4x": ["train.steps=4000", "optim.warmup_steps=400", "train.eval_every=400"],
                                   "vision/fmnist-30ep": ["train.epochs=30"],
                                   "lra/listops-96k": ["data.max_examples=96000", "data.max_test_examples=2000",
                                                       "data.seq_len=200", "data.options.min_length=50",
                                                       "data.options.max_length=200", "train.steps=6000",
                                                       "optim.warmup_steps=600", "train.eval_every=600"]}


#: the model every other model of a comparison is measured against.
REFERENCE = "Transformer"
LABELS = {"transformer": REFERENCE, "vit": REFERENCE, "primalformer": "PrimalFormer", "primal+": "Primal.+Trans."}
RL_LABELS = {"dt": "DT", "primal+": "Primal.+DT"}
BASELINES = ROOT / "docs" / "results" / "baselines"
#: fresh runs: never the sweep seed (0), whose run of the chosen point is what won the selection.
FINAL_SEEDS = (1, 2, 3)
#: comparisons that need more seeds to resolve the paper's differences: JapaneseVowels' validation (54
#: series) saturates and 3 seeds give intervals of ±1.2-1.8 points against the paper's 0.2-0.5.
MORE_SEEDS = {"uea/JapaneseVowels": tuple(range(1, 11))}


def seeds_for(comparison: str) -> tuple[int, ...]:
    """The final seeds of ``comparison``."""
    return MORE_SEEDS.get(comparison, FINAL_SEEDS)


def entries(comparison: str) -> list[Entry]:
    """The models of ``comparison`` with their configs and sweep stores."""
    out = []
    for config in COMPARISONS[comparison]:
        stem = config.split("/")[-1]
        kind = stem.removesuffix("_cpu").rsplit("_", 1)[-1]
        labels = RL_LABELS if comparison.startswith("rl/") else LABELS
        out.append(Entry(labels[kind], ROOT / "configs" / f"{config}.yaml", STORE / (stem + STORE_SUFFIX.get(comparison, ""))))
    return out


def rl_average(datasets: list[str] | None = None) -> dict[str, list[float]] | None:
    """Per model (DT, Primal.+DT), the val-selected test score of each final seed averaged over the RL
    datasets (default all: the paper's summary figure); None until every one's final seeds are stored."""
    per_model: dict[str, list[list[float]]] = {}
    for d in RL_DATASETS if datasets is None else datasets:
        for e in entries(f"rl/{d}"):
            o = outcome(e)
            if o is None or len(o.test) != len(FINAL_SEEDS):
                return None
            per_model.setdefault(e.label, []).append(o.test)
    return {label: [statistics.mean(seed) for seed in zip(*rows)] for label, rows in per_model.items()}


def waiting_for(comparison: str) -> str | None:
    """Why ``comparison`` cannot run on this machine yet (its data is not collected), or None."""
    if comparison.startswith("rl/"):
        name = comparison.removeprefix("rl/")
        if not dataset_file(name).is_file():
            return f"dataset {name} not collected (primal data collect-rl {name.split('-')[0]})"
    return None


def baselines(comparison: str, compute: bool = True) -> dict:
    """Trivial baselines of ``comparison`` on the final seeds' holdout splits (cached in docs/results/baselines);
    for an RL dataset, the behaviour policy: the normalised return of the dataset's own episodes."""
    if comparison.startswith("rl/"):
        name = comparison.removeprefix("rl/")
        scores = collected_behaviour()
        rows = {"behaviour": {"what": "the dataset's own episodes (mean D4RL-normalised return)",
                              "test_score": [scores[name]]}} if name in scores else {}
        linear = rl_linear_baseline(comparison, compute)
        return {**rows, **({"linear": linear} if linear else {})}
    first = ROOT / "configs" / f"{COMPARISONS[comparison][0]}.yaml"
    return baselines_for(first, seeds_for(comparison), BASELINES / f"{comparison.replace('/', '_')}.json",
                         OVERRIDES.get(comparison, []), compute=compute)


def trivial_line(comparison: str) -> str:
    """The stored trivial baselines of ``comparison`` for a table of earlier runs: ``"linear 84.8 · majority
    9.1"`` (mean test value of each, best first; nothing computed). "" where none is stored."""
    try:
        rows = baselines(comparison, compute=False)
    except LookupError:
        return ""
    metric = selection_metric(comparison)
    key = next((k for r in rows.values() for k in r if k.startswith("test_")), None)
    if key is None:
        return ""
    scale, digits = display_scale(key[5:]), display_digits(key[5:])
    means = sorted(((statistics.mean(r[key]), name) for name, r in rows.items() if r.get(key)),
                   reverse=metric != "loss")
    return " · ".join(f"{name} {scale * m:.{digits}f}" for m, name in means)


def trivial_note(*comparisons: str) -> str:
    """How a page introduces :func:`trivial_line` of ``comparisons`` beside a table of earlier runs, naming the
    seeds whose validation splits chose them (the comparisons' final seeds)."""
    seeds = sorted({seed for c in comparisons for seed in seeds_for(c)})
    return ("trivial baselines on the same data and TEST set (each fit on train, chosen on the validation splits "
            f"of seeds {', '.join(map(str, seeds))}, the tuned comparison's final seeds, mean over them; "
            "`docs/results/baselines/`)")


def rl_linear_baseline(comparison: str, compute: bool = True) -> dict | None:
    """The linear policy of an RL comparison's dataset (train.trivial.linear_policy, the comparison's own
    rollouts; its env seeds do not depend on the run's seed, so one fit), kept in docs/results/baselines
    and tied to the collection it was fit on (a re-collected dataset is fit again); None where it is
    neither stored for this machine's data nor computable (the data not collected, or ``compute`` False)."""
    name = comparison.removeprefix("rl/")
    env, dataset = name.split("-", 1)
    card = dataset_file(name).parent / f"{env}-seed0-card.json"
    stats = json.loads(card.read_text())["datasets"].get(dataset) if card.is_file() else None
    # the collection's statistics name the data (not the file's path: the cache folder differs per machine)
    key = None if stats is None else {k: v for k, v in stats.items() if k != "file"}
    try:
        rows = baselines_for(ROOT / "configs" / f"{COMPARISONS[comparison][0]}.yaml", FINAL_SEEDS[:1],
                             BASELINES / f"{comparison.replace('/', '_')}.json", OVERRIDES.get(comparison, []),
                             compute=compute and dataset_file(name).is_file(), data_key=key)
    except LookupError:
        return None
    return rows.get("linear")


#: per RL dataset, the behaviour policy's normalised score read from the collection card of the data the
#: tuned runs use (a re-collection need not retrace an earlier one, so the earlier pages' scores are not used).
COLLECTED_BEHAVIOUR = BASELINES / "rl_collected_behaviour.json"


def collected_behaviour() -> dict[str, float]:
    """The recorded behaviour scores per RL dataset, first updated from the collection cards this machine's
    cache has (kept in COLLECTED_BEHAVIOUR so that a machine without the data still shows them)."""
    recorded = json.loads(COLLECTED_BEHAVIOUR.read_text()) if COLLECTED_BEHAVIOUR.is_file() else {}
    current = dict(recorded)
    for env in D4RL_SCORES:
        card = dataset_file(f"{env}-{DATASETS[0]}").parent / f"{env}-seed0-card.json"
        if card.is_file():
            stats = json.loads(card.read_text())["datasets"]
            current.update({f"{env}-{d}": stats[d]["score_mean"] for d in DATASETS if d in stats})
    if current != recorded:
        COLLECTED_BEHAVIOUR.parent.mkdir(parents=True, exist_ok=True)
        COLLECTED_BEHAVIOUR.write_text(json.dumps(dict(sorted(current.items())), indent=2) + "\n")
    return current


def selection_metric(comparison: str) -> str:
    """The metric the comparison's task selects on (accuracy, or the LM's loss)."""
    from primal_attention.train.load import load_config
    from primal_attention.train.families import get_family

    cfg = load_config(ROOT / "configs" / f"{COMPARISONS[comparison][0]}.yaml", OVERRIDES.get(comparison, []))
    return get_family(cfg.data.family).task.select


def beyond(value: float, up: bool) -> float:
    """The next value of the 1-3-10 ladder above (``up``) or below ``value``: 3e-3 -> 1e-2, 1e-4 -> 3e-5."""
    exponent = math.floor(math.log10(value) + 1e-9)
    mantissa = round(value / 10 ** exponent)
    if up:
        return float(f"{3 * 10 ** exponent if mantissa < 3 else 10 ** (exponent + 1):.1g}")
    return float(f"{10 ** exponent if mantissa >= 3 else 3 * 10 ** (exponent - 1):.1g}")


#: at most this many widenings per side: a choice still at the edge after them is flagged on the page.
MAX_WIDENINGS = 4


def grid_for(comparison: str) -> dict[str, list[float]]:
    """The learning rates every model of ``comparison`` is swept over: its starting grid (START_GRIDS, else
    GRID), widened one step beyond an edge whenever every model's sweep of the current grid is complete and
    some model chose that edge (on validation), again and again until every choice is interior (at most
    MAX_WIDENINGS per side), so that no model's choice is cut off by the grid while all keep the same grid
    and budget."""
    lrs = list(START_GRIDS.get(comparison, GRID)["optim.lr"])
    widened = {"low": 0, "high": 0}
    while True:
        grid = {"optim.lr": lrs}
        chosen = [base_sweep(config, comparison, grid).chosen() for config in COMPARISONS[comparison]]
        if any(c is None for c in chosen):
            return grid
        picked = {c.point["optim.lr"] for c in chosen}
        low = lrs[0] in picked and widened["low"] < MAX_WIDENINGS
        high = lrs[-1] in picked and widened["high"] < MAX_WIDENINGS
        if not (low or high):
            return grid
        widened["low"] += low
        widened["high"] += high
        lrs = [*([beyond(lrs[0], up=False)] if low else []), *lrs, *([beyond(lrs[-1], up=True)] if high else [])]


def section(comparison: str) -> list[str]:
    """The tuned comparison as markdown lines for a results page."""
    base = START_GRIDS.get(comparison, GRID)
    grid = ", ".join(f"`{k}` ∈ {{{', '.join(f'{v:g}' for v in vs)}}}" for k, vs in base.items())
    added = [v for v in grid_for(comparison)["optim.lr"] if v not in base["optim.lr"]]
    if added:
        grid += (f", widened for every model by {', '.join(f'{v:g}' for v in added)} (a model's choice on the first grid "
                 "lay at its edge)")
    models = entries(comparison)  # the first is the softmax model the others are measured against
    extra = OVERRIDES.get(comparison)
    return [f"Every model swept over {grid} on the same step budget, seed 0, selected on validation (a tie: the lower validation loss at "
            "each run's selected evaluation, the first to reach its best) "
            f"(`scripts/sweep_comparisons.py --only {comparison}`; `primal sweep`), then the chosen point trained with seeds "
            f"{', '.join(map(str, seeds_for(comparison)))}" + (f"; every run with {', '.join(f'`{o}`' for o in extra)}" if extra else "")
            + ". Test values: mean ± sample std over the final seeds, each seed's evaluation selected on validation; Δ: "
            "Welch 95 % interval of the difference of means, *within noise* when it contains 0 (parity). Trivial baselines on "
            "the same splits (the final seeds').", "", *tuned_section(models, baselines(comparison), reference=models[0].label,
                                                          metric=selection_metric(comparison),
                                                          pending=pending_longer(comparison))]


def pending_longer(comparison: str) -> str | None:
    """Why ``comparison`` gives no verdict yet: the longer comparison that it needs (:data:`LONGER`,
    :data:`NEEDED_BECAUSE`) is not finished, e.g. ``"this schedule leaves curves rising; `lm/corpora-4x`
    not finished"``; None where it needs none or that one is complete."""
    for longer, (short, _) in LONGER.items():
        if short == comparison and longer in COMPARISONS and progress(longer) != "complete":
            return f"{NEEDED_BECAUSE[longer]}; `{longer}` not finished"
    return None


def progress(comparison: str) -> str:
    """"complete" (every model's final seeds stored), "in progress" or "not started", from the stored sweeps."""
    reports = [s.report() for s in sweeps_of(comparison)]
    if all(r["final_complete"] for r in reports):
        return "complete"
    return "in progress" if any(r["points"] for r in reports) else "not started"


def schedule_scale(comparison: str, record: dict) -> float:
    """The length of ``comparison``'s schedule over an earlier run's (``record``, a stored run): its
    ``train.epochs`` or ``train.steps`` override against the run's own epochs or steps; 1 where neither."""
    sets = dict(o.split("=", 1) for o in OVERRIDES.get(comparison, []))
    for key, field in (("train.epochs", "epochs"), ("train.steps", "steps")):
        if key in sets and record.get(field):
            return float(sets[key]) / float(record[field])
    return 1.0


def remaining(comparison: str) -> tuple[int, float | None, str]:
    """Runs left in ``comparison`` (grid points and final seeds, on the grid as it stands plus the widening a
    finished model's edge choice makes certain, :func:`certain_widening`; a later widening adds more), the
    one-core hours they take (each model's runs left at its expected time per run, :func:`expected_run_s`), and
    where those times come from."""
    widen = certain_widening(comparison)
    left = {config: len(s.points) - len(s.results()) + len(s.final_seeds) - len(s.finals()) + widen
            for config, s in zip(COMPARISONS[comparison], sweeps_of(comparison))}
    expected, source = expected_run_s(comparison)
    runs = sum(left.values())
    if not runs:
        return 0, 0.0, source
    if any(t is None for t in expected.values()):
        return runs, None, source
    return runs, sum(n * expected[c] for c, n in left.items()) / 3600, source


def model_times(comparison: str) -> tuple[dict[str, list[float]], str]:
    """Per model config of ``comparison``, the wall times (s) a run of it takes, and where they come from, each
    model from the first source that has its times: its runs so far; its shorter comparison's runs, scaled to
    this schedule and by :func:`longer_slowdown`; the earlier runs of the same config that a page keeps, scaled
    to this schedule and by :func:`sibling_slowdown` ([] where none has them)."""
    configs = COMPARISONS[comparison]
    sources = (lambda: ({c: _run_times(s) for c, s in zip(configs, sweeps_of(comparison))}, "its runs so far"),
               lambda: _short_times(comparison), lambda: _earlier_model_times(comparison))
    times: dict[str, list[float]] = {}
    used: list[str] = []
    last = ""
    for read in sources:  # a source is read only while some model still lacks times
        missing = [c for c in configs if not times.get(c)]
        if not missing:
            break
        found, source = read()
        last = source or last
        for config in missing:
            if found.get(config):
                times[config] = found[config]
                used += [] if source in used else [source]
    return {c: times.get(c, []) for c in configs}, " and ".join(used) or last


def _short_times(comparison: str) -> tuple[dict[str, list[float]], str]:
    """A longer comparison's models' times from its short comparison's runs, scaled to its schedule and by the
    slowdown the other longer schedules showed (:func:`longer_slowdown`); ({}, "") for any other comparison."""
    if comparison not in LONGER:
        return {}, ""
    short, scale = LONGER[comparison]
    found = {c: [scale * t for t in _run_times(s)] for c, s in zip(COMPARISONS[comparison], sweeps_of(short))}
    source = f"the runs of {short}, times {scale:g} (this schedule's length)"
    if any(found.values()) and (slowdown := longer_slowdown(comparison)):
        ratio, others = slowdown
        found = {c: [ratio * t for t in ts] for c, ts in found.items()}
        source += (f", times {ratio:.2f} (the median ratio, per model, of the runs of {', '.join(others)} to their "
                   "short comparisons' runs scaled alike)")
    return found, source


def _earlier_model_times(comparison: str) -> tuple[dict[str, list[float]], str]:
    """The models' times from the earlier runs of the same configs, scaled to this schedule and by the family's
    slowdown (:func:`sibling_slowdown`)."""
    earlier = {c: _earlier_times(comparison, c) for c in COMPARISONS[comparison]}
    scales = {scale for _, scaled in earlier.values() for scale in scaled}
    source = "the earlier runs of the same configs" + (
        " (their own schedule)" if scales <= {1.0} else ", scaled to this schedule's length")
    times = {c: t for c, (t, _) in earlier.items()}
    if any(times.values()) and (slowdown := sibling_slowdown(comparison)):
        ratio, siblings = slowdown
        times = {c: [ratio * v for v in t] for c, t in times.items()}
        source += f", times {ratio:.2f} (the median ratio of the runs of {', '.join(siblings)} to their earlier runs)"
    return times, source


def longer_slowdown(comparison: str) -> tuple[float, list[str]] | None:
    """(median ratio, the comparisons it comes from) over the models that have runs of the model's median run
    time to the median of its short comparison's runs of the same model scaled to the longer length (runs of a
    longer schedule took longer, or shorter, than that scaling says): the models of ``comparison`` itself where
    any has runs (the same schedule and data), else those of every other longer comparison (:data:`LONGER`);
    None where none has runs."""
    def ratios(longer: str) -> list[float]:
        short, scale = LONGER[longer]
        return [statistics.median(mine) / (scale * statistics.median(theirs))
                for own, before in zip(sweeps_of(longer), sweeps_of(short))
                if (mine := _run_times(own)) and (theirs := _run_times(before))]

    if comparison in LONGER and (own := ratios(comparison)):
        return statistics.median(own), [comparison]
    found = {longer: r for longer in LONGER if longer != comparison and (r := ratios(longer))}
    return (statistics.median([x for r in found.values() for x in r]), sorted(found)) if found else None


def sibling_slowdown(comparison: str) -> tuple[float, list[str]] | None:
    """(median ratio, the comparisons it comes from) of the median run time to the median earlier-run time (both
    at the same schedule), over the same family's other comparisons that have both; None where none has."""
    family = comparison.split("/")[0]
    ratios = {}
    for other in COMPARISONS:
        if other != comparison and other.split("/")[0] == family:
            own = [t for sweep in sweeps_of(other) for t in _run_times(sweep)]
            before = [t for config in COMPARISONS[other] for t in _earlier_times(other, config)[0]]
            if own and before:
                ratios[other] = statistics.median(own) / statistics.median(before)
    return (statistics.median(ratios.values()), sorted(ratios)) if ratios else None


def certain_widening(comparison: str) -> int:
    """Grid points per model that ``comparison``'s grid as it stands is certain to gain: one a side where a model
    whose sweep of it is complete chose that edge, at least one for a two-rate grid (the grid widens once every
    model's sweep is complete; 0 once all are, :func:`grid_for` having widened what it will)."""
    grid = grid_for(comparison)
    lrs, start = grid["optim.lr"], START_GRIDS.get(comparison, GRID)["optim.lr"]
    chosen = [base_sweep(config, comparison, grid).chosen() for config in COMPARISONS[comparison]]
    if all(c is not None for c in chosen):
        return 0
    picked = {c.point["optim.lr"] for c in chosen if c is not None}
    if len(lrs) == 2 and not picked:  # a two-rate grid has no inside: whatever is chosen, one side widens
        picked = {lrs[0]}
    low_left = sum(v < min(start) for v in lrs) < MAX_WIDENINGS  # a side widened MAX_WIDENINGS times stays
    high_left = sum(v > max(start) for v in lrs) < MAX_WIDENINGS
    return (lrs[0] in picked and low_left) + (lrs[-1] in picked and high_left)


def _run_times(sweep: Sweep) -> list[float]:
    """Wall times (s) of ``sweep``'s finished grid points."""
    return [float(p.metrics["wall_time_s"]) for p in sweep.results() if p.metrics.get("wall_time_s")]


def _earlier_times(comparison: str, config: str) -> tuple[list[float], list[float]]:
    """(wall times scaled to ``comparison``'s schedule, the scales) of the earlier runs of ``config`` that a page
    keeps (``docs/results/<family>_runs/<config>``: the holdout runs and those of the authors' protocol)."""
    folder = STORE.parent / f"{config.split('/')[0]}_runs" / config.split("/")[-1]
    files = [*folder.glob("seed_*.json"), *folder.glob("holdout/seed_*.json"), *folder.glob("authors*/seed_*.json")]
    times, scales = [], []
    for r in (json.loads(f.read_text()) for f in files):
        if r.get("wall_time_s"):
            scales.append(schedule_scale(comparison, r))
            times.append(scales[-1] * float(r["wall_time_s"]))
    return times, scales


def not_rerun_note(names: dict[str, str]) -> list[str]:
    """A page's line naming what is not (fully) rerun under the tuned protocol, with the runs left and their
    one-core hours (:func:`remaining`): ``names`` maps a label on the page to its comparison (or to "" where
    no comparison is registered)."""
    left = []
    for label, comparison in names.items():
        state = progress(comparison) if comparison in COMPARISONS else "not registered"
        if state == "complete":
            continue
        if state == "not registered":
            left.append(f"{label} ({state})")
            continue
        runs, hours, source = remaining(comparison)
        cost = "time per run unknown" if hours is None else f"≈ {hours:.1f} CPU h at the median time per run of {source}"
        if (wider := certain_widening(comparison)):
            cost += f"; counting the {wider} rate{'s' if wider > 1 else ''} per model that a choice at the grid's edge adds"
        waiting = waiting_for(comparison)
        left.append(f"{label} ({state}; {runs} runs left, {cost}" + (f"; first: {waiting}" if waiting else "") + ")")
    if not left:
        return []
    return [f"Not rerun under this protocol yet: {'; '.join(left)}. One CPU core per run; a grid widened at an edge "
            "adds runs. `scripts/sweep_comparisons.py --only <comparison>` runs one (resumable).", ""]


def base_sweep(config: str, comparison: str, grid: dict[str, list[float]] = GRID, start_by: float | None = None) -> Sweep:
    """The sweep of one model of ``comparison`` over ``grid`` (its store and run folders), starting no cell
    after ``start_by`` (``time.time()`` seconds; None: any time)."""
    stem = config.split("/")[-1] + STORE_SUFFIX.get(comparison, "")
    return Sweep(ROOT / "configs" / f"{config}.yaml", grid, WORK / stem, STORE / stem, sweep_seed=0,
                 final_seeds=seeds_for(comparison), overrides=tuple(OVERRIDES.get(comparison, [])), threads=1,
                 start_by=start_by)


def sweeps_of(comparison: str, deadline: float | None = None) -> list[Sweep]:
    """The sweep of every model of ``comparison`` over the comparison's grid (:func:`grid_for`, read once); with
    a ``deadline`` (``time.time()`` seconds), each starts no run later than its expected run time
    (:func:`expected_run_s`) before it, and none where that time is unknown."""
    grid = grid_for(comparison)
    expected = expected_run_s(comparison)[0] if deadline is not None else {}
    # a model whose run time is unknown is not started under a deadline (it could end hours past it)
    return [base_sweep(config, comparison, grid, None if deadline is None else
                       deadline - t if (t := expected.get(config)) is not None else -math.inf)
            for config in COMPARISONS[comparison]]


def expected_run_s(comparison: str) -> tuple[dict[str, float | None], str]:
    """Per model config of ``comparison``, the time (s) one of its runs is expected to take: the median of its
    times (:func:`model_times`), else the median of the other models' times; None where none is known. And
    where those times come from."""
    times, source = model_times(comparison)
    known = [t for ts in times.values() for t in ts]
    expected: dict[str, float | None] = {}
    for config in COMPARISONS[comparison]:
        own = times.get(config) or known
        expected[config] = statistics.median(own) if own else None
    return expected, source


def settled_grids(comparison: str, deadline: float | None = None) -> tuple[list[Sweep], list[bool]]:
    """One pass over every model's grid of ``comparison`` (no final seeds), widened and passed over again for
    as long as a completed grid widens (:func:`grid_for`), so that final seeds start only on a grid whose
    every choice is interior: the sweeps (with ``deadline``, :func:`sweeps_of`) and whether each grid is complete."""
    group = sweeps_of(comparison, deadline)
    grids = [s.step(finals=False) for s in group]
    while all(grids) and (wider := sweeps_of(comparison, deadline))[0].grid != group[0].grid:
        group, grids = wider, [s.step(finals=False) for s in wider]
    return group, grids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma-separated comparisons (default: all, in priority order)")
    p.add_argument("--list", action="store_true", help="print each sweep's state and exit")
    p.add_argument("--baselines", action="store_true",
                   help="compute (and cache) the trivial baselines of each comparison on its final seeds' splits, then exit")
    p.add_argument("--poll", type=float, default=60.0, help="seconds between passes while others hold the cells left")
    p.add_argument("--hours", type=float, default=None,
                   help="start only runs expected to end within this many hours (by their model's median run time, "
                        "as the pages estimate it), taking shorter comparisons' runs when a longer one would not finish; stop when none is left")
    args = p.parse_args()
    if args.hours is not None and not (0 < args.hours < math.inf):
        p.error(f"--hours must be a positive, finite number, got {args.hours:g}")
    if args.hours is not None and (args.list or args.baselines):
        p.error("--hours applies to training runs, not to --list or --baselines")
    names = args.only.split(",") if args.only else list(COMPARISONS)
    unknown = sorted(set(names) - set(COMPARISONS))
    if unknown:
        p.error(f"unknown comparison(s) {', '.join(unknown)}; expected {', '.join(COMPARISONS)}")
    if args.baselines:
        for comparison in names:
            if waiting_for(comparison):
                continue
            rows = baselines(comparison)
            print(comparison, {k: [round(v, 4) for v in r.get("test_acc", r.get("test_loss", r.get("test_score", [])))]
                               for k, r in rows.items()}, flush=True)
        return
    if args.list:
        sweeps = [(c, s) for c in names for s in sweeps_of(c)]
        for comparison, s in sweeps:
            rep = s.write_report() if s.results() else s.report()  # refreshes the pages' view of a sweep
            waiting = waiting_for(comparison)
            print(f"{comparison:20s} {s.config.stem:28s} points {len(rep['points'])}/{len(s.points)} "
                  f"chosen {rep['chosen']} finals {rep['final'].get('test_' + rep['selection']['metric'][4:], {}).get('n', 0)}"
                  f"/{len(s.final_seeds)}" + (f"  (waiting: {waiting})" if waiting else ""))
        return
    for name in list(names):
        waiting = waiting_for(name)
        if waiting:
            print(f"skipping {name}: {waiting}", flush=True)
            names.remove(name)
    deadline = None if args.hours is None else time.time() + 3600 * args.hours
    if deadline is not None:
        print(f"starting only runs expected to end by {time.strftime('%H:%M', time.localtime(deadline))}", flush=True)
    if names:
        work_through(names, args.poll, deadline)


def stored_runs(comparison: str) -> int:
    """How many runs of ``comparison`` are stored (grid points and final seeds, every model)."""
    return sum(len(s.results()) + len(s.finals()) for s in sweeps_of(comparison))


def work_through(names: list[str], poll: float, deadline: float | None = None) -> None:
    """Train the comparisons ``names`` (in priority order) until all are complete. A pass goes comparison by
    comparison, every model's grid first, then every model's final seeds (so that an interrupted session leaves
    whole comparisons rather than one model far ahead of the others); once a comparison's pass has stored a new
    run without finishing it, the next pass starts again from the first comparison, so that a worker freed by a
    run takes the highest-priority cell there is (a grid widened meanwhile included), not a later comparison's.
    A pass that stored nothing waits ``poll`` seconds (every cell left is held by another worker). With a
    ``deadline`` (``time.time()`` seconds), a run starts only if its model's median run so far would end by then
    (:func:`sweeps_of`), so shorter comparisons fill the time a long run would not finish in; the worker stops
    after a pass that stored nothing and found no cell held by another worker (what is left is past its start
    time, or waits on a cell that is)."""
    while True:
        done, progressed, held = True, False, False
        for name in names:
            before = stored_runs(name)
            group, grids = settled_grids(name, deadline)
            finished = all([s.step() for s in group]) if all(grids) else False
            done &= finished
            held |= any(s.held for s in group)
            if not finished and stored_runs(name) > before:
                progressed = True
                break
        if done:
            return
        if deadline is not None and not progressed and not held:
            # every cell left is past its start time or waits on one that is: nothing will free up before the deadline
            print("stopping: no run left that would end before the deadline", flush=True)
            return
        if not progressed:
            time.sleep(poll)

if __name__ == "__main__":
    main()

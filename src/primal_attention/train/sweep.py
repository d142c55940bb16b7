"""Hyper-parameter sweeps selected on validation: ``primal sweep``.

A sweep trains one config at every point of a grid (``optim.lr=1e-4,3e-4,1e-3`` and more keys, their
product), all with the same step budget and one seed, under the holdout protocol; it selects the point
with the best **validation** metric (the task's own: accuracy, validation loss, rollout score); then
trains that point with the final seeds, fresh runs whose seeds differ from the sweep's (the sweep's run of
the chosen point won the selection, so reusing it would carry that luck into the result). Test metrics are recorded at every point (for the record) but
never used to choose.

Layout of ``out`` (checkpoints, git-ignored in this repository) and ``store`` (small JSON, committable;
``out`` when not given)::

    store/points/<point>/seed_<s>.json    metrics + evaluation history of one grid point
    store/final/seed_<s>.json             metrics of the chosen point, one file per final seed
    store/sweep.json, store/sweep.md      the grid, the table of points, the choice, the final summary
    out/work/<point>/seed_<s>/            the run directories (checkpoints: an interrupted cell resumes)
    out/locks/                            one lock file per cell

Resumable and parallel: a cell whose JSON exists is never trained again; a cell being trained is held by
an advisory file lock (released by the OS when its process ends, crashed or not), so any number of
``primal sweep`` processes with the same arguments share the grid, and a crashed worker's cell is
taken up by the next one. ``workers=k`` starts k - 1 such processes beside this one.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from primal_attention.provenance import shown_path
from primal_attention.train.config import ConfigError
from primal_attention.train.load import load_config
from primal_attention.train.data import check_buildable
from primal_attention.train.experiments import run_stored
from primal_attention.train.stats import mean_std

__all__ = ["Sweep", "SweepPoint", "grid_points", "parse_grid", "point_name", "run_sweep", "select_point"]

#: keys a grid may not vary: they define the comparison itself (seed, protocol) or its outputs.
FIXED_KEYS = ("train.seed", "train.protocol", "train.progress", "train.threads")


def parse_grid(specs: Sequence[str]) -> dict[str, list[Any]]:
    """``["optim.lr=1e-4,3e-4", "train.eta=0,0.1"]`` -> ``{"optim.lr": [1e-4, 3e-4], "train.eta": [0, 0.1]}``.

    Each value is read as YAML (``1e-4`` is a number, ``null`` is None, ``true`` a bool). Raises
    ConfigError for a malformed spec, an empty or repeated value list, a repeated key, or a fixed key.
    """
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        key, sep, raw = spec.partition("=")
        key = key.strip()
        if not sep or not key or not raw.strip():
            raise ConfigError(f"--grid {spec!r} must look like key.sub=v1,v2,...")
        if key in grid:
            raise ConfigError(f"--grid: {key} is given twice")
        if key in FIXED_KEYS:
            raise ConfigError(f"--grid: {key} cannot be swept (a sweep fixes {', '.join(FIXED_KEYS)})")
        values = []
        for text in raw.split(","):
            text = text.strip()
            if not text:
                raise ConfigError(f"--grid {spec!r}: empty value")
            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError as err:
                raise ConfigError(f"--grid {spec!r}: {text!r} is not a valid value") from err
            if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
                try:
                    value = float(value)
                except ValueError:
                    pass
            values.append(value)
        if len({repr(v) for v in values}) != len(values):
            raise ConfigError(f"--grid {spec!r}: a value is repeated")
        grid[key] = values
    if not grid:
        raise ConfigError("a sweep needs at least one --grid key=v1,v2,...")
    return grid


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in the order given (the first key varies slowest)."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def point_name(point: dict[str, Any]) -> str:
    """A folder name for a point: ``optim.lr=0.0003,train.eta=0.1`` (characters other than letters,
    digits and ``._=,+-`` become ``_``)."""
    text = ",".join(f"{k}={_fmt(v)}" for k, v in point.items())
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)


def _fmt(value: Any) -> str:
    """A value as a grid point's name and its ``--set`` spell it: floats exactly (the shortest text that
    reads back as the same float, so 1.0000001e-4 and 1e-4 are two points, not one run reported twice)."""
    if isinstance(value, float):
        return repr(value)
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _overrides(point: dict[str, Any]) -> list[str]:
    return [f"{k}={_fmt(v)}" for k, v in point.items()]


@dataclass
class SweepPoint:
    """One grid point's outcome: its validation metric (what selects), the validation loss at that
    evaluation (what breaks a tie; None where the history lacks it), and, for the record only, its
    test metric (``None`` where the run did not track TEST)."""

    point: dict[str, Any]
    name: str
    val: float
    test: float | None
    metrics: dict[str, Any] = field(repr=False)
    val_loss: float | None = None


def selected_val_loss(metrics: dict[str, Any], metric: str, maximize: bool) -> float | None:
    """The validation loss of a run's selected evaluation (the first with the best validation metric),
    from its stored history; None where the history has no validation loss."""
    key = f"val_{metric}"
    rows = [r for r in metrics.get("history", []) if key in r and "val_loss" in r]
    if not rows:
        return None
    best = rows[0]
    for r in rows[1:]:
        if (r[key] > best[key]) if maximize else (r[key] < best[key]):
            best = r
    return float(best["val_loss"])


def selection_of(metrics: dict[str, Any]) -> tuple[str, bool]:
    """(metric, maximize) that a stored holdout run was selected on: ``metrics["selection"]``, else
    read from the metrics a run carries (accuracy, else score, else loss)."""
    sel = metrics.get("selection")
    if sel:
        return sel["metric"], bool(sel["maximize"])
    for name, maximize in (("acc", True), ("score", True), ("loss", False)):
        if f"best_val_{name}" in metrics:
            return name, maximize
    raise ConfigError(f"run {metrics.get('name')} has no validation metric: was it trained under the holdout protocol?")


def select_point(points: Sequence[SweepPoint], maximize: bool) -> SweepPoint:
    """The point with the best validation metric; a tie (a saturated validation accuracy, say) goes to
    the lower validation loss at the selected evaluation, then to the point earlier in the grid."""
    if not points:
        raise ValueError("select_point: no points")

    def key(p: SweepPoint) -> tuple[float, float]:
        loss = p.val_loss if p.val_loss is not None else math.inf
        return (-p.val if maximize else p.val, loss)

    return min(points, key=key)  # min keeps the first of equal keys: the earlier grid point


@dataclass
class Sweep:
    """A sweep of ``config`` over ``grid``; see the module docstring for the layout and protocol."""

    config: Path
    grid: dict[str, list[Any]]
    out: Path
    store: Path | None = None
    sweep_seed: int = 0
    final_seeds: tuple[int, ...] = (1, 2, 3)
    overrides: tuple[str, ...] = ()
    threads: int = 1
    #: no cell starts after this moment (``time.time()`` seconds; None: any time); a cell already running finishes
    start_by: float | None = None
    #: cells this object found held by another process (a worker waits for those, not for cells past ``start_by``)
    held: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.config, self.out = Path(self.config), Path(self.out)
        self.store = Path(self.store) if self.store is not None else self.out
        if not self.final_seeds:
            raise ConfigError("a sweep needs at least one final seed")
        if self.sweep_seed in self.final_seeds:
            # the grid point was chosen because that very run scored best on validation: reusing (or
            # retraining, deterministically) it as a final seed carries the selection's luck into the result
            raise ConfigError(f"final seeds {list(self.final_seeds)} must not include the sweep seed {self.sweep_seed}: "
                              "the chosen point's sweep run is what selected it (use e.g. --seeds 1,2,3)")
        if self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        # Fail now, on every point, for what would fail only when that point's turn comes, and for a store
        # whose points were trained with another resolved config (another --set, an edited config).
        for point in grid_points(self.grid):
            cfg = load_config(self.config, self._sets(point))
            check_buildable(cfg)
            self._check_stored(point, cfg)

    def _check_stored(self, point: dict[str, Any], cfg: Any) -> None:
        """ConfigError when a stored cell of ``point`` was trained with a resolved config other than ``cfg``."""
        folders = [self.store / "points" / point_name(point)]
        if self.chosen_or_none_point() == point:
            folders.append(self.store / "final" / point_name(point))
        want = resolved(cfg)
        for folder in folders:
            for path in sorted(folder.glob("seed_*.json")) if folder.is_dir() else []:
                try:
                    stored = json.loads(path.read_text())
                except (OSError, ValueError) as err:
                    raise ConfigError(f"{path} is not a stored sweep cell ({err}); remove it to train it again") from err
                had = stored.get("config") or self._config_of_command(stored.get("command"))
                if had is None:
                    continue
                diff = sorted(k for k in set(had) | set(want) if had.get(k) != want.get(k))
                if diff:
                    raise ConfigError(f"{path} was trained with another config (differs in {', '.join(diff[:4])}"
                                      f"{', ...' if len(diff) > 4 else ''}): use another --store, or the same --set")

    def chosen_or_none_point(self) -> dict[str, Any] | None:
        """The chosen point when the stored grid is complete (read from the store), else None."""
        path = self.store / "sweep.json"
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text()).get("chosen")
        except ValueError:
            return None

    def _config_of_command(self, command: str | None) -> dict[str, Any] | None:
        """The resolved config of a cell stored before cells kept their config: its ``--set`` values on
        this sweep's config file."""
        if not command:
            return None
        words = shlex.split(command)
        sets = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]
        try:
            return resolved(load_config(self.config, sets))
        except ConfigError:
            return None

    def _sets(self, point: dict[str, Any]) -> list[str]:
        # The holdout protocol is what makes the selection honest: it is forced, not configurable.
        return [*self.overrides, *_overrides(point), "train.protocol=holdout", f"train.threads={self.threads}"]

    @property
    def points(self) -> list[dict[str, Any]]:
        return grid_points(self.grid)

    def cells(self) -> list[tuple[str, dict[str, Any], int, Path]]:
        """(name, point, seed, JSON path) of every grid cell (one seed each)."""
        return [(point_name(p), p, self.sweep_seed, self.store / "points" / point_name(p) / f"seed_{self.sweep_seed}.json")
                for p in self.points]

    def results(self) -> list[SweepPoint]:
        """The grid points trained so far, in grid order."""
        out = []
        for name, point, _, path in self.cells():
            if path.is_file():
                metrics = json.loads(path.read_text())
                metric, maximize = selection_of(metrics)
                test = metrics.get("test_" + metric)
                out.append(SweepPoint(point, name, float(metrics[f"best_val_{metric}"]), test, metrics,
                                      selected_val_loss(metrics, metric, maximize)))
        return out

    def chosen(self) -> SweepPoint | None:
        """The selected point once every grid point is trained, else None."""
        done = self.results()
        if len(done) < len(self.points):
            return None
        _, maximize = selection_of(done[0].metrics)
        return select_point(done, maximize)

    def final_cells(self, chosen: SweepPoint) -> list[tuple[str, dict[str, Any], int, Path]]:
        # one folder per chosen point: finals of an earlier choice are never mistaken for this one's
        return [("final", chosen.point, s, self.store / "final" / chosen.name / f"seed_{s}.json")
                for s in self.final_seeds]

    def run_cell(self, name: str, point: dict[str, Any], seed: int, path: Path) -> bool:
        """Train one cell unless it is stored, another process holds it or it is past ``start_by``; True if it is
        stored now."""
        if path.is_file():
            return True
        if self.start_by is not None and time.time() > self.start_by:
            return False
        locks = self.out / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        kind = "final" if name == "final" else "point"
        with open(locks / f"{kind}-{point_name(point)}-seed_{seed}.lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.held += 1
                return False  # another worker trains it
            if not path.is_file():
                run_stored(self.config, path, self.out / "work" / point_name(point), seed, self._sets(point),
                           config_record=resolved(load_config(self.config, self._sets(point))))
        return True

    def step(self, *, finals: bool = True) -> bool:
        """One pass: train every grid cell no other worker holds; once the grid is complete (and unless
        ``finals`` is False), every final cell likewise. True when all that was asked for is stored."""
        grid_done = all([self.run_cell(*c) for c in self.cells()])
        if self.results():
            self.write_report()  # the points so far, so a results page shows a sweep in progress
        chosen = self.chosen() if grid_done else None
        if chosen is None or not finals:
            return grid_done
        done = all([self.run_cell(*c) for c in self.final_cells(chosen)])
        self.write_report()
        return done

    def run(self, *, poll: float = 30.0) -> dict[str, Any]:
        """Train the grid, select on validation, train the chosen point's final seeds (waiting for cells
        that other workers hold); write and return the report."""
        while not self.step():
            time.sleep(poll)
        return self.write_report()

    def finals(self) -> list[dict[str, Any]]:
        """The stored final runs of the chosen point."""
        chosen = self.chosen()
        if chosen is None:
            return []
        return [json.loads(p.read_text()) for *_, p in self.final_cells(chosen) if p.is_file()]

    def report(self) -> dict[str, Any]:
        """The grid, every trained point (validation and test metric), the choice and the final seeds."""
        done = self.results()
        metric, maximize = selection_of(done[0].metrics) if done else ("acc", True)
        chosen = self.chosen()
        finals = self.finals()
        summary = {}
        for key in (f"test_{metric}", f"best_val_{metric}", f"best_test_{metric}", f"final_test_{metric}", "wall_time_s"):
            values = [float(f[key]) for f in finals if key in f]
            if values:
                mean, sd = mean_std(values)
                summary[key] = {"mean": mean, "std": sd, "n": len(values), "values": values}
        cfg = load_config(self.config, list(self.overrides))
        return {
            "config": shown_path(self.config),
            "name": cfg.name,
            "overrides": list(self.overrides),
            "grid": self.grid,
            "sweep_seed": self.sweep_seed,
            "final_seeds": list(self.final_seeds),
            "selection": {"metric": f"val_{metric}", "maximize": maximize,
                          "rule": "best validation metric of each run (its val-selected evaluation); a tie goes to the "
                                  "lower validation loss at that evaluation, then to the earlier grid point"},
            "budget": {"steps": cfg.train.steps, "epochs": cfg.train.epochs, "batch_size": cfg.train.batch_size},
            # selected on the loss, the point's val_loss is the metric itself
            "points": [{"point": p.point, "name": p.name, f"val_{metric}": p.val,
                        "val_loss": p.val if metric == "loss" else p.val_loss, f"test_{metric}": p.test,
                        "wall_time_s": p.metrics.get("wall_time_s")} for p in done],
            "complete": len(done) == len(self.points),
            "chosen": None if chosen is None else chosen.point,
            "final": summary,
            "final_complete": len(finals) == len(self.final_seeds),
        }

    def write_report(self) -> dict[str, Any]:
        """Write ``sweep.json`` and ``sweep.md`` into the store; return the report."""
        rep = self.report()
        self.store.mkdir(parents=True, exist_ok=True)
        # written whole then renamed: several workers may write it, a reader never sees half a file
        for name, text in (("sweep.json", json.dumps(rep, indent=2)), ("sweep.md", render_markdown(rep))):
            tmp = self.store / f".{name}.{os.getpid()}.tmp"
            tmp.write_text(text)
            os.replace(tmp, self.store / name)
        return rep


#: config keys that do not change what a run computes (how it reports, how many threads it uses).
_NOT_RESULT_KEYS = ("train.progress", "train.threads", "train.device", "train.retain_freed_memory", "name")


def resolved(cfg: Any) -> dict[str, Any]:
    """The resolved config of a run as flat ``{"section.key": value}``, without the keys that do not change
    its result: what a stored sweep cell is keyed by."""
    import dataclasses

    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                walk(f"{prefix}{f.name}.", getattr(value, f.name))
        else:
            flat[prefix[:-1]] = value

    walk("", cfg)
    return {k: v for k, v in flat.items() if k not in _NOT_RESULT_KEYS}


def render_markdown(rep: dict[str, Any]) -> str:
    """The sweep as a short markdown page: the grid table (validation selects) and the final seeds."""
    metric = rep["selection"]["metric"].removeprefix("val_")
    scale = 100.0 if metric in ("acc",) else 1.0
    unit = " %" if scale == 100.0 else ""
    show = lambda v: "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{scale * v:.2f}"  # noqa: E731
    lines = [f"# Sweep of {rep['name']}", "",
             f"Config `{rep['config']}`" + (f" with {', '.join(f'`{o}`' for o in rep['overrides'])}" if rep["overrides"] else "")
             + f"; budget per point: {rep['budget']['steps'] or rep['budget']['epochs']} "
             f"{'steps' if rep['budget']['steps'] else 'epochs'} of batch {rep['budget']['batch_size']}; seed {rep['sweep_seed']};"
             f" holdout protocol. Selected on **validation {metric}** ({'higher' if rep['selection']['maximize'] else 'lower'} is better;"
             " a tie goes to the lower validation loss at each run's selected evaluation, the first to reach its best, then"
             " to the earlier point). Test is shown for the record, never"
             " used to choose.", "",
             f"| point | val {metric}{unit} | val loss | test {metric}{unit} (val-selected evaluation) | time (s) | |",
             "|---|---|---|---|---|---|"]
    for p in rep["points"]:
        mark = "**chosen**" if p["point"] == rep["chosen"] else ""
        wall = p.get("wall_time_s")
        loss = p.get("val_loss")
        lines.append(f"| {p['name']} | {show(p['val_' + metric])} | {'–' if loss is None else f'{loss:.4f}'} | "
                     f"{show(p['test_' + metric])} | "
                     f"{'–' if wall is None else f'{wall:.0f}'} | {mark} |")
    if not rep["complete"]:
        lines += ["", f"{len(rep['points'])} of {len(grid_points(rep['grid']))} points trained so far."]
    final = rep["final"]
    key = f"test_{metric}"
    if key in final:
        f = final[key]
        lines += ["", f"Chosen point, {f['n']} of {len(rep['final_seeds'])} final seeds: test {metric} "
                      f"{scale * f['mean']:.2f} ± {scale * f['std']:.2f}{unit} (mean ± sample std over seeds; "
                      f"each seed's evaluation selected on validation)."]
    return "\n".join(lines) + "\n"


def run_sweep(config: str | Path, grid: dict[str, list[Any]], out: str | Path, *, store: str | Path | None = None,
              sweep_seed: int = 0, final_seeds: Sequence[int] = (1, 2, 3), overrides: Sequence[str] = (),
              threads: int = 1, workers: int = 1, poll: float = 30.0) -> dict[str, Any]:
    """Run (or continue) a sweep; with ``workers`` > 1, ``workers - 1`` more processes share its cells.

    Returns the report (also written to ``store/sweep.json`` and ``sweep.md``).
    """
    sweep = Sweep(Path(config), grid, Path(out), None if store is None else Path(store), sweep_seed,
                  tuple(final_seeds), tuple(overrides), threads)
    helpers = []
    for _ in range(max(0, workers - 1)):
        command = [sys.executable, "-m", "primal_attention.cli", "sweep", str(config), "--out", str(out),
                   "--store", str(sweep.store), "--sweep-seed", str(sweep_seed),
                   "--seeds", ",".join(map(str, final_seeds)), "--threads", str(threads), "--workers", "1"]
        for key, values in grid.items():
            command += ["--grid", f"{key}={','.join(_fmt(v) for v in values)}"]
        for o in overrides:
            command += ["--set", o]
        helpers.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, env={**os.environ, "PRIMAL_SWEEP_WORKER": "1"}))
        print("$", shlex.join(command), "&", flush=True)
    try:
        report = sweep.run(poll=poll)
    finally:
        for h in helpers:
            h.wait()
    failed = [h.args for h in helpers if h.returncode]
    if failed:
        raise RuntimeError(f"{len(failed)} sweep worker(s) failed; run the same command again to continue")
    return report


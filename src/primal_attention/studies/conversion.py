"""Regenerate docs/results/convert.md: a trained softmax model converted to Primal-Attention.

Task ``lm4x`` (first on the page): the original is the Transformer LM of the 4× schedule of
docs/results/lm.md (6 000 steps at lr 1e-2, its final seeds 1, 2, 3, whose run folders
``scripts/sweep_comparisons.py --only lm/corpora-4x`` leaves in ``runs/sweeps``; trained again with the
same settings where they are gone), which clears the bigram baseline. Four arms, each attention transfer
T steps then fine-tuning F steps: last layer primal, all layers primal, and all layers window + primal
(``WindowPrimalAttention``) with w 32 and w 128 (the window's values copied from the softmax layer, the
gate starting at α ≈ 0.88 on the window). From scratch: the 6 000-step final seeds of PrimalFormer and
Primal.+Trans. of lm.md are shown, and every arm's architecture trained for 6 000 + T + F steps (the
scratch cells, run after all conversions). Cost, one thread: a conversion ≈ 4-6 CPU min (window arms
the slower), 12 in all ≈ 1 CPU h once the originals exist; each scratch run ≈ 45 CPU min (12 ≈ 9 CPU h).

Task ``lm``, per seed (0, 1, 2), on the LM corpora of docs/results/lm.md:

1. the original: the Transformer LM of ``configs/lm/corpora_transformer.yaml`` (1 500 steps), trained
   again in ``runs/results_convert`` when its weights are not there (the runs of lm.md keep no weights);
2. conversions of its last layer (Primal.+Trans.) and of all layers (PrimalFormer-LM), with the primal
   options and η of ``corpora_primal+.yaml`` / ``corpora_primalformer.yaml``: (i) no transfer, fine-tune
   F steps; (ii) attention transfer T steps, and (iii) the same transfer followed by F fine-tuning steps
   ((ii) is the transfer stage of run (iii), evaluated before fine-tuning starts);
3. from scratch: the same two architectures trained for 1 500 + T + F steps (the steps of the original
   and of conversion (iii)); the 1 500-step runs of lm.md are shown too.

And one classifier for the non-causal path: UEA JapaneseVowels, the Transformer of
``configs/uea/JapaneseVowels_transformer.yaml`` with fewer epochs and the holdout protocol, its last layer
and all layers converted the same way, against PrimalFormer / Primal.+Trans. trained from scratch for the
same total steps.

Every cell is stored as JSON under ``docs/results/convert_runs/`` (a cell whose file exists is not run
again; an interrupted cell continues from its checkpoints in ``runs/results_convert``); the page is
written from the stored JSON only, and lists what is missing. Decode memory and tokens/s at 4K-64K are
those of the architectures (docs/results/lm/decode.json, measured by ``primal bench --level decode``;
``--decode`` measures them again into docs/results/convert/decode.json).

Cost (estimated from measured step times, one thread): about 3.5 CPU hours. LM ≈ 2.7 h: per seed the
original ≈ 620 s (its 1 500 steps, lm.md), the four conversions ≈ 880 s (a transfer step ≈ 0.12 s, a
fine-tuning step ≈ 0.3 s, an evaluation of val + test ≈ 25 s), the two 2 100-step scratch runs ≈ 1 720 s.
JapaneseVowels ≈ 0.8 h (D 512: ≈ 0.45 s per step with its evaluations). ``--tasks lm4x``, ``--tasks lm`` and ``--tasks uea``
store into different folders and can run as two processes at once.

    .venv/bin/python scripts/results_convert.py                 # the whole grid, then the page
    .venv/bin/python scripts/results_convert.py --table-only    # rewrite the page from stored runs
    .venv/bin/python scripts/results_convert.py --tasks uea     # only the classifier part
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from primal_attention.provenance import shown_path
from primal_attention.studies.comparison import baseline_what, clears_baseline
from primal_attention.train.experiments import run_stored
from primal_attention.train.stats import value_cell


def _committed(obj):
    """A record as committed: every absolute path inside the repository written relative to it (the
    records name no path of the machine that made them)."""
    if isinstance(obj, dict):
        return {k: _committed(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_committed(v) for v in obj]
    if isinstance(obj, str):
        return obj.replace(f"{ROOT}/", "")
    return obj
from primal_attention.studies.paths import ROOT

LAYERS = {"last": "last layer (Primal.+Trans.)", "all": "all layers (PrimalFormer)"}
ARMS = {"finetune": "(i) no transfer, fine-tune", "transfer": "(ii) transfer", "transfer_finetune": "(iii) transfer + fine-tune"}
#: how this protocol relates to the linearisation literature's (the lm4x page).
LOLCATS = (
    "**Against LoLCATs, in kind.** LoLCATs (Zhang et al., ICLR 2025, arXiv:2410.10254) linearises pretrained "
    "LLMs (Llama 3 8B, Mistral 7B, up to 405B) in the same two stages as (iii): attention transfer (the new "
    "attentions trained to match the softmax layers' outputs, an output MSE) and then a short fine-tune (LoRA "
    "there, the whole model here), and finds that quality after conversion needs a sliding window of softmax "
    "attention beside the linear term in each layer: with it the converted Llama 3 8B keeps about 80 % of its "
    "5-shot MMLU; without it, swap then fine-tune and even attention transfer then fine-tune leave MMLU at "
    "chance (23.8). "
    "The scale here is another world (a 4-layer, D 128 LM; 600 optimiser steps of 16 × 128 tokens; quality as "
    "test bits/byte, not a downstream benchmark), so the fractions kept are not comparable as numbers. What "
    "can be compared is the pattern: whether the all-primal conversion leaves a gap to the original, and "
    "whether a window beside the primal term closes it (the window rows above), with the gates showing how "
    "much of each head the window takes once trained.")

#: the gate logit of the window-only control: α = σ(20) = 1 − 2e-9 on the window, and so little gradient
#: reaches the gate (α(1 − α)) or the primal branch (1 − α) that it stays a sliding-window softmax.
WINDOW_ONLY_GATE = 20.0

#: the gate logit a window + primal conversion starts from: α = σ(2) ≈ 0.88 on the window (copied from
#: the softmax layer), so the swapped model starts near the windowed original and the primal branch still
#: gets an eighth of each head.
WINDOW_GATE_INIT = 2.0


@dataclass
class Arm:
    """One converted architecture: which layers, the from-scratch config of the same architecture, and
    the conversion options beyond that config's primal options (a window)."""

    label: str
    layers: str
    scratch: str
    primal: dict = field(default_factory=dict)
    scratch_sets: list[str] = field(default_factory=list)


def paper_arms(last: str, all_: str) -> dict[str, Arm]:
    return {"last": Arm(LAYERS["last"], "last", last), "all": Arm(LAYERS["all"], "all", all_)}


@dataclass
class Task:
    """One converted model family: its original config, the converted architectures, the schedule."""

    name: str
    title: str
    original: str
    arms: dict[str, Arm]
    metric: str  # the quality metric of the table (test, val-selected)
    higher_is_better: bool
    transfer_steps: int
    finetune_steps: int
    eval_every: int
    overrides: list[str] = field(default_factory=list)
    #: metrics of the 1 500-step from-scratch runs of another page, per layers choice (optional)
    published: dict[str, str] = field(default_factory=dict)
    #: the trivial baselines of the original's config on the same splits (docs/results/baselines, cached
    #: by `primal baselines` / scripts/sweep_comparisons.py), shown beside the original
    baselines: str = ""
    #: the conversion recipes run per arm ((iii) and (i), or (iii) only)
    recipes: tuple[str, ...] = ("transfer_finetune", "finetune")
    #: seeds of this task (None: --seeds)
    seeds: tuple[int, ...] | None = None
    #: the original's trained run folder per seed, when another study trained it ("{seed}" filled in);
    #: used as it is instead of training the original again
    original_runs: str = ""
    #: what trained those run folders (recorded with each original)
    original_runs_by: str = ""
    #: the label of the published from-scratch rows
    published_label: str = "scratch, 1 500 steps (lm.md)"
    #: paragraphs after the verdict (context for reading it)
    notes: list[str] = field(default_factory=list)

    def trivial(self) -> dict[str, dict]:
        """name -> {what, test values} of the cached trivial baselines ({} when none are cached)."""
        path = ROOT / self.baselines if self.baselines else None
        if path is None or not path.is_file():
            return {}
        return {name: {"what": baseline_what(b), "test": b[f"test_{self.metric}"], "ppl": b.get("test_ppl")}
                for name, b in json.loads(path.read_text())["baselines"].items() if b.get(f"test_{self.metric}")}


def tasks(args: argparse.Namespace) -> dict[str, Task]:
    lm_sets = ["train.threads=1", *args.set]
    uea_sets = ["train.threads=1", f"train.epochs={args.uea_epochs}", "train.protocol=holdout", "train.track_test=true",
                *args.uea_set]
    lm4x_sets = ["train.threads=1", "optim.lr=0.01", "train.steps=6000", "optim.warmup_steps=800",
                 "train.eval_every=500", "train.protocol=holdout", *args.set]
    final = "docs/results/sweeps/corpora_{}_4x/final/optim.lr=0.01"
    window = "configs/lm/corpora_window_primalformer.yaml"
    return {
        "lm4x": Task("lm4x", "Language model, an original that clears its baselines (LM corpora, the 4× schedule of "
                     "docs/results/lm.md)", "configs/lm/corpora_transformer.yaml",
                     {**paper_arms("configs/lm/corpora_primal+.yaml", "configs/lm/corpora_primalformer.yaml"),
                      "window32": Arm("all layers window 32 + primal", "all", window,
                                      {"window": 32, "gate_init": WINDOW_GATE_INIT}),
                      "window32_only": Arm("all layers window 32 alone (gate at α ≈ 1: a control)", "all", window,
                                           {"window": 32, "gate_init": WINDOW_ONLY_GATE},
                                           [f"model.attention_options.window_primal.gate_init={WINDOW_ONLY_GATE}"]),
                      "window128": Arm("all layers window 128 + primal", "all", window,
                                       {"window": 128, "gate_init": WINDOW_GATE_INIT},
                                       ["model.attention_options.window_primal.window=128"])},
                     "bpb", False, args.transfer_steps, args.finetune_steps, args.eval_every, lm4x_sets,
                     published={"original": final.format("transformer"), "last": final.format("primal+"),
                                "all": final.format("primalformer")} if not args.set else {},
                     baselines="docs/results/baselines/lm_corpora.json" if not args.set else "",
                     recipes=("transfer_finetune",), seeds=(1, 2, 3) if not args.set else None,
                     original_runs="runs/sweeps/corpora_transformer_4x/work/optim.lr=0.01/seed_{seed}" if not args.set else "",
                     original_runs_by="scripts/sweep_comparisons.py --only lm/corpora-4x (its final seeds)",
                     published_label="scratch, 6 000 steps (lm.md 4×, its final seeds)", notes=[LOLCATS]),
        "lm": Task("lm", "Language model (LM corpora, docs/results/lm.md)", "configs/lm/corpora_transformer.yaml",
                   paper_arms("configs/lm/corpora_primal+.yaml", "configs/lm/corpora_primalformer.yaml"),
                   "bpb", False, args.transfer_steps, args.finetune_steps, args.eval_every, lm_sets,
                   published={"last": "docs/results/lm_runs/corpora_primal+",
                              "all": "docs/results/lm_runs/corpora_primalformer",
                              "original": "docs/results/lm_runs/corpora_transformer"} if not args.set else {},
                   baselines="docs/results/baselines/lm_corpora.json" if not args.set else ""),
        "uea": Task("uea", "Classifier (UEA JapaneseVowels, non-causal)", "configs/uea/JapaneseVowels_transformer.yaml",
                    paper_arms("configs/uea/JapaneseVowels_primal+.yaml", "configs/uea/JapaneseVowels_primalformer.yaml"),
                    "acc", True, args.uea_transfer_steps, args.uea_finetune_steps, args.uea_eval_every, uea_sets,
                    baselines="docs/results/baselines/uea_JapaneseVowels.json"),
    }


class Study:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.results = Path(args.results)
        self.store = self.results / "convert_runs"
        self.work = Path(args.work)
        self.page = self.results / "convert.md"
        self.tasks = tasks(args)

    def seeds(self, task: Task) -> list[int]:
        """--seeds when given, else the task's own seeds, else 0, 1, 2."""
        if self.args.seeds is not None:
            return list(self.args.seeds)
        return list(task.seeds) if task.seeds is not None else [0, 1, 2]

    # -- cells ------------------------------------------------------------------------------------
    def original(self, task: Task, seed: int, weights: bool = True) -> tuple[dict, Path]:
        """The original's stored metrics and its run folder; trained when its metrics are not stored, or
        retrained (deterministically) when ``weights`` are needed and the run folder is gone. A task whose
        originals another study trained (``original_runs``) takes that run folder when it is there."""
        from primal_attention.train.load import load_config
        from primal_attention.train.trainer import run_seeds

        store = self.store / task.name / "original" / f"seed_{seed}.json"
        work = self.work / task.name / "original"
        run_dir = work / f"seed_{seed}"
        config = ROOT / task.original
        trained = ROOT / task.original_runs.format(seed=seed) if task.original_runs else None
        if trained is not None and (trained / "metrics.json").is_file() and not (run_dir / "metrics.json").is_file():
            if not store.is_file():
                self._store_original(task, seed, trained, store, trained_by=task.original_runs_by)
            return json.loads(store.read_text()), trained
        if not store.is_file() or (weights and not (run_dir / "metrics.json").is_file()):
            print(f"[{task.name}] original seed {seed}: training {config.name} -> {run_dir}", flush=True)
            run_seeds(load_config(config, ["train.progress=false", *task.overrides]), work, [seed], resume=True)
            metrics = json.loads((run_dir / "metrics.json").read_text())
            if store.is_file():
                before = json.loads(store.read_text())
                print(f"[{task.name}] retrained seed {seed}: test {task.metric} {metrics[f'test_{task.metric}']:.5f} "
                      f"(stored {before[f'test_{task.metric}']:.5f})", flush=True)
            else:
                self._store_original(task, seed, run_dir, store)
        return json.loads(store.read_text()), run_dir

    @staticmethod
    def _store_original(task: Task, seed: int, run_dir: Path, store: Path, **extra: str) -> None:
        """Store the metrics of the original's run folder with the ``primal train`` command that made it."""
        metrics = json.loads((run_dir / "metrics.json").read_text())
        metrics["command"] = shlex.join(["primal", "train", task.original, "--out", shown_path(run_dir.parent), "--seeds",
                                         str(seed), "--resume"] + [x for o in task.overrides for x in ("--set", o)])
        metrics.update(extra)
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_text(json.dumps(_committed(metrics), indent=2))

    def scratch_primal_options(self, task: Task, key: str) -> tuple[dict, float]:
        """The primal options and the η (per mean task loss) of the from-scratch config of arm ``key``,
        with the arm's own conversion options on top."""
        from primal_attention.train.load import load_config

        arm = task.arms[key]
        cfg = load_config(ROOT / arm.scratch, [*task.overrides, *arm.scratch_sets])
        eta = cfg.train.eta
        if cfg.train.ksvd_weighting == "summed":  # η on the summed NLL: per mean NLL it is η / tokens per batch
            eta /= cfg.train.batch_size * cfg.data.seq_len
        options = cfg.model.attention_options
        return {**dict(options.get("primal", options.get("window_primal", {}))), **arm.primal}, eta

    def conversion(self, task: Task, key: str, arm: str, seed: int) -> dict:
        from primal_attention.convert import ConvertOptions, convert_run

        store = self.store / task.name / f"{key}_{arm}" / f"seed_{seed}.json"
        if store.is_file():
            return json.loads(store.read_text())
        _, run_dir = self.original(task, seed)
        primal, eta = self.scratch_primal_options(task, key)
        layers = task.arms[key].layers
        options = ConvertOptions(layers=layers, primal=primal, eta=eta, seed=seed, progress=False,
                                 transfer_steps=task.transfer_steps if arm == "transfer_finetune" else 0,
                                 finetune_steps=task.finetune_steps, eval_every=task.eval_every,
                                 warmup_steps=max(1, task.finetune_steps // 10))
        out = self.work / task.name / f"{key}_{arm}" / f"seed_{seed}"
        print(f"[{task.name}] convert {key} {arm} seed {seed} -> {out}", flush=True)
        report = convert_run(run_dir, out, options)
        if "window" in primal:  # the learned share of the window per layer and head (σ of the gates)
            from primal_attention.layers.window import WindowPrimalAttention
            from primal_attention.train.run import load_run

            model = load_run(out).model
            report["window_alpha"] = [m.alpha.tolist() for m in model.modules() if isinstance(m, WindowPrimalAttention)]
        report["command"] = shlex.join(
            ["primal", "convert", shown_path(run_dir), "--out", shown_path(out), "--layers", layers, "--transfer-steps",
             str(options.transfer_steps), "--finetune-steps", str(options.finetune_steps), "--eta", repr(eta),
             "--set", f"eval_every={options.eval_every}", "--set", f"warmup_steps={options.warmup_steps}",
             "--set", f"seed={seed}"] + [x for k, v in primal.items() for x in ("--set", f"primal.{k}={v}")])
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_text(json.dumps(_committed(report), indent=2))
        return report

    def scratch(self, task: Task, key: str, seed: int) -> dict:
        original, _ = self.original(task, seed, weights=False)
        total = int(original["steps"]) + task.transfer_steps + task.finetune_steps
        sets = [*task.overrides, *task.arms[key].scratch_sets, "train.epochs=null", f"train.steps={total}",
                f"train.eval_every={max(1, total // 6)}"]
        store = self.store / task.name / f"scratch_{key}" / f"seed_{seed}.json"
        return run_stored(ROOT / task.arms[key].scratch, store, self.work / task.name / f"scratch_{key}", seed, sets)

    def cells(self, task: Task) -> list[tuple[str, tuple]]:
        """Every seed's original and conversions first, then the (longer) from-scratch runs."""
        out = []
        for seed in self.seeds(task):
            out.append((f"{task.name}-original-{seed}", (self.original, task, seed, False)))
            for key in task.arms:
                for arm in task.recipes:
                    out.append((f"{task.name}-{key}_{arm}-{seed}", (self.conversion, task, key, arm, seed)))
        if not self.args.no_scratch:
            for seed in self.seeds(task):
                for key in task.arms:
                    out.append((f"{task.name}-scratch_{key}-{seed}", (self.scratch, task, key, seed)))
        return out

    def run(self) -> None:
        """Every cell in order, one worker (each cell is resumable, so the script can be stopped any time)."""
        for name in self.args.tasks:
            for cell, (fn, *params) in self.cells(self.tasks[name]):
                fn(*params)
                self.write_page()

    # -- page -------------------------------------------------------------------------------------
    def _stored(self, task: Task, key: str) -> list[dict]:
        folder = self.store / task.name / key
        return [json.loads((folder / f"seed_{s}.json").read_text()) for s in self.seeds(task)
                if (folder / f"seed_{s}.json").is_file()]

    def write_page(self) -> None:
        lines = [
            "# Converting a trained softmax model to Primal-Attention — measured here",
            "",
            "Regenerate: `.venv/bin/python scripts/results_convert.py` (resumable; `--table-only` rewrites this page",
            "from `docs/results/convert_runs/`). How to convert your own model: [docs/convert.md](../convert.md).",
            "",
            "What each row is: the **original** softmax model; **swap only**: its layers replaced by primal layers",
            "initialised from them (q, k and output projections copied), no training; **(i)** swap, then fine-tune",
            "the whole model for F steps (task loss + η·KSVD); **(ii)** swap, then attention transfer for T steps (only",
            "the new layers train, all at once, to match the softmax layers' outputs on the model's own training",
            "data: relative MSE + η·KSVD); **(iii)** (ii) followed by the same F fine-tuning steps; **scratch**: the",
            "same primal architecture trained from random weights with the config of lm.md / the UEA table,",
            "for as many steps as the original plus (iii) (and, LM, for the 1 500 steps of lm.md).",
            "Fine-tuning: AdamW lr 3e-4, 10 % warmup then cosine, validation every few steps, the best validation",
            "loss (LM) / accuracy (UEA) selects the weights; TEST is evaluated once with them (val-selected).",
            "Primal options and η are those of the from-scratch configs (η on the summed NLL converted to the",
            "mean-loss scale: η / tokens per batch). Steps and CPU seconds of a conversion are those spent after the",
            "original was trained (one thread; the original's own cost is on its row). Mean ± sample std over seeds.",
            "",
            "**Verdict rule.** A conversion *keeps the original's quality* when its mean test metric is within 2 %",
            "of the original's (bits/byte: at most 1.02× the original's; accuracy: at least 0.98×) and it *beats",
            "training from scratch* when its mean is better than the scratch run of the same total steps by more",
            "than the larger of the two standard deviations.",
            "",
        ]
        missing: list[str] = []
        for name in self.tasks:  # every task on the page, whichever ones this invocation trains
            lines += self._task_section(self.tasks[name], missing)
        lines += self._decode_section()
        if missing:
            lines += ["## Missing", "", "Cells without stored results (run the script to fill them):", ""]
            lines += [f"- {m}" for m in missing] + [""]
        self.page.parent.mkdir(parents=True, exist_ok=True)
        self.page.write_text("\n".join(lines) + "\n")
        print(f"wrote {self.page}", flush=True)

    def _task_section(self, task: Task, missing: list[str]) -> list[str]:
        m = task.metric
        unit = {"bpb": "bits/byte", "acc": "accuracy"}[m]
        seeds = self.seeds(task)
        done = [r for key in task.arms for r in self._stored(task, f"{key}_transfer_finetune")]
        t, f = (done[0]["settings"]["transfer_steps"], done[0]["settings"]["finetune_steps"]) if done else \
            (task.transfer_steps, task.finetune_steps)  # the stored runs' schedule wins over the arguments
        lines = [f"## {task.title}", "",
                 f"Original: `{task.original}` ({', '.join(task.overrides) or 'as committed'}); T = {t} "
                 f"transfer steps, F = {f} fine-tuning steps.", ""]
        head = f"| model | n | test {unit} | test ppl | kept vs original | beats scratch (same steps)? | steps | CPU s |"
        if m == "acc":
            head = head.replace(" test ppl |", "")
        lines += [head, "|" + "---|" * (head.count("|") - 1)]
        originals = self._stored(task, "original")
        if len(originals) < len(seeds):
            missing.append(f"{task.name}: original, seeds stored {len(originals)}/{len(seeds)}")
        base = statistics.mean(r[f"test_{m}"] for r in originals) if originals else None

        walls: list[bool] = []

        def seconds(runs: list[dict]) -> tuple[list[float], bool]:
            """CPU seconds of trained runs (the trainer's ``cpu_time_s``; ``cpu_s`` in records stored before
            it kept them); wall seconds, flagged, where a run's CPU time is unknown."""
            cpu = [r.get("cpu_s", r.get("cpu_time_s")) for r in runs]
            return [r["wall_time_s"] if c is None else c for c, r in zip(cpu, runs)], None in cpu

        def row(label: str, values: list[float], ppl: list[float], steps: str, cpu: list[float],
                scratch: list[float] | None, wall: bool = False) -> str:
            kept = "–"
            if base is not None and values:
                mean = statistics.mean(values)
                ratio = (base / mean) if not task.higher_is_better else (mean / base)
                kept = f"{100 * ratio:.1f} %" + (" (keeps)" if ratio >= 0.98 else "")
            beats = "–"
            if scratch and values:
                sd = max(statistics.stdev(values) if len(values) > 1 else 0.0,
                         statistics.stdev(scratch) if len(scratch) > 1 else 0.0)
                diff = statistics.mean(values) - statistics.mean(scratch)
                better = diff > sd if task.higher_is_better else -diff > sd
                worse = -diff > sd if task.higher_is_better else diff > sd
                beats = "yes" if better else ("no, worse" if worse else "tie")
            digits = 4 if m == "bpb" else 3
            cells = [label, str(len(values)), value_cell(values, digits)]
            if m != "acc":
                cells.append(value_cell(ppl))
            walls.append(wall)
            cells += [kept, beats, steps, (value_cell(cpu, 0) + (" †" if wall else "")) if cpu else "–"]
            return "| " + " | ".join(cells) + " |"

        if task.original_runs:
            lines[-2:-2] = [f"The originals are the final seeds ({', '.join(map(str, seeds))}) of that schedule, their "
                            f"run folders used as they are (`{task.original_runs}`), not retrained; the from-scratch "
                            "rows of the same 6 000 steps are the final seeds of the other two models. Window arms "
                            f"start with the gate logit {WINDOW_GATE_INIT} (α = σ({WINDOW_GATE_INIT}) ≈ "
                            f"{1 / (1 + 2.718281828 ** -WINDOW_GATE_INIT):.2f} on the window, whose values are copied "
                            "from the softmax layer). The LM's blocks are 128 tokens, so the window-128 arm is softmax "
                            "over the whole block beside the primal term in training and evaluation; its window slides "
                            "only when decoding longer contexts. The scratch rows of the same total steps "
                            "(6 000 + T + F, at the original's lr 1e-2, which the 4× grid chose for every model it "
                            "swept; the window architectures were not swept) run after every conversion, ≈ 45 CPU "
                            "min each.", ""]
        elif originals and task.published.get("original"):
            # lm.md's runs keep no weights: the originals here are retrained with the same config and seeds.
            pub = {r["seed"]: r for r in (json.loads(p.read_text()) for p in
                                          sorted((ROOT / task.published["original"]).glob("seed_*.json")))}
            pairs = [(r[f"test_{m}"], pub[r["seed"]][f"test_{m}"]) for r in originals if r["seed"] in pub]
            if pairs:
                lines[-2:-2] = [f"The originals were retrained here from the config of lm.md; test {unit} of each seed "
                                "here vs lm.md: " + ", ".join(f"{a:.4f} vs {b:.4f}" for a, b in pairs) + ".", ""]
        cpu, wall = seconds(originals)
        lines.append(row("original (softmax)", [r[f"test_{m}"] for r in originals],
                         [r.get("test_ppl", 0) for r in originals],
                         f"{originals[0]['steps']} (its training)" if originals else "–",
                         cpu, None, wall))
        for name, b in task.trivial().items():
            cells = [f"*trivial: {name}* ({b['what']})", str(len(b["test"])), value_cell(b["test"], 4 if m == "bpb" else 3)]
            if m != "acc":
                cells.append(value_cell(b["ppl"]) if b["ppl"] else "–")
            lines.append("| " + " | ".join(cells + ["–"] * 4) + " |")
        for layers, arm in task.arms.items():
            label = arm.label
            scratch = self._stored(task, f"scratch_{layers}")
            if len(scratch) < len(seeds):
                missing.append(f"{task.name}: scratch {layers}, seeds stored {len(scratch)}/{len(seeds)}")
            scratch_values = [r[f"test_{m}"] for r in scratch]
            full = self._stored(task, f"{layers}_transfer_finetune")
            plain = self._stored(task, f"{layers}_finetune")
            for key, got in ((f"{layers}_{recipe}", self._stored(task, f"{layers}_{recipe}")) for recipe in task.recipes):
                if len(got) < len(seeds):
                    missing.append(f"{task.name}: convert {key}, seeds stored {len(got)}/{len(seeds)}")

            def stage(reports: list[dict], key: str) -> list[float]:
                return [r[key]["test"][m] for r in reports if r.get(key) and r[key].get("test")]

            def ppl(reports: list[dict], key: str) -> list[float]:
                return [r[key]["test"].get("ppl", 0) for r in reports if r.get(key) and r[key].get("test")]

            def cost(reports: list[dict], stages: tuple[str, ...]) -> list[float]:
                return [sum(r[s]["cpu_s"] for s in stages if s in r) for r in reports]

            lines.append(f"| **{label}** | | | {'| ' if m != 'acc' else ''}| | | |")
            lines.append(row("swap only", stage(full, "swap"), ppl(full, "swap"), "0", [], scratch_values))
            if "finetune" in task.recipes:
                lines.append(row(ARMS["finetune"], stage(plain, "final"), ppl(plain, "final"), f"F = {f}",
                                 cost(plain, ("finetune",)), scratch_values))
            lines.append(row(ARMS["transfer"], stage(full, "transfer"), ppl(full, "transfer"), f"T = {t}",
                             cost(full, ("transfer",)), scratch_values))
            lines.append(row(ARMS["transfer_finetune"], stage(full, "final"), ppl(full, "final"),
                             f"T + F = {t + f}", cost(full, ("transfer", "finetune")),
                             scratch_values))
            total = f"{scratch[0]['steps']} (all from scratch)" if scratch else "–"
            cpu, wall = seconds(scratch)
            lines.append(row("scratch, same total steps", scratch_values, [r.get("test_ppl", 0) for r in scratch], total,
                             cpu, None, wall))
            published = task.published.get(layers)
            if published:
                pub = [json.loads(p.read_text()) for p in sorted((ROOT / published).glob("seed_*.json"))]
                if pub:
                    cpu, wall = seconds(pub)
                    lines.append(row(task.published_label, [r[f"test_{m}"] for r in pub],
                                     [r.get("test_ppl", 0) for r in pub], str(pub[0].get("steps", "–")), cpu, None, wall))
        if any(walls):
            lines += ["", "† wall-clock seconds (one thread, other jobs beside it) for runs whose CPU time was not "
                          "recorded (trained before the trainer kept CPU time, or resumed across sessions before that)."]
        lines += ["", *self._verdict(task), ""]
        for note in task.notes:
            lines += [note, ""]
        lines += self._errors(task)
        return lines

    def _verdict(self, task: Task) -> list[str]:
        """One plain sentence per layers choice: quality kept, extra cost, and scratch of the same steps."""
        m = task.metric
        originals = self._stored(task, "original")
        if not originals:
            return ["*Verdict: no results yet.*"]
        base = statistics.mean(r[f"test_{m}"] for r in originals)

        def kept(values: list[float]) -> float:
            mean = statistics.mean(values)
            return 100 * (mean / base if task.higher_is_better else base / mean)

        out = ["**Verdict** (by the rule above; quality kept = the original's bits/byte ÷ the model's, or the model's",
               "accuracy ÷ the original's; 100 % = as good as the original):", ""]
        trivial = {name: statistics.mean(b["test"]) for name, b in task.trivial().items()}
        if trivial:
            best = (max if task.higher_is_better else min)(trivial, key=trivial.get)
            originals_m = [r[f"test_{m}"] for r in originals]
            if not clears_baseline(originals_m, trivial[best], task.higher_is_better):
                out += [f"- **The original is not clearly above the best trivial baseline** ({best}: {trivial[best]:.4g}; "
                        f"original {statistics.mean(originals_m):.4g}): on this task a conversion's kept quality says "
                        "little about attention.", ""]
        for layers, arm in task.arms.items():
            label = arm.label
            full = self._stored(task, f"{layers}_transfer_finetune")
            plain = self._stored(task, f"{layers}_finetune")
            scratch = [r[f"test_{m}"] for r in self._stored(task, f"scratch_{layers}")]
            parts = []
            for name, reports, key, stages in (("swap only", full, "swap", ()), ("(i)", plain, "final", ("finetune",)),
                                               ("(ii)", full, "transfer", ("transfer",)),
                                               ("(iii)", full, "final", ("transfer", "finetune"))):
                vals = [r[key]["test"][m] for r in reports if r.get(key) and r[key].get("test")]
                if not vals:
                    continue
                cpu = statistics.mean(sum(r[s]["cpu_s"] for s in stages if s in r) for r in reports)
                words = "keeps the quality" if kept(vals) >= 98 else "does not keep it"
                parts.append(f"{name} {kept(vals):.1f} %, {words} ({cpu:.0f} CPU s after the original)")
            if scratch:
                parts.append(f"training the same architecture from scratch for the same total steps reaches "
                             f"{kept(scratch):.1f} %")
            out.append(f"- {label}: " + ("; ".join(parts) if parts else "no conversions stored yet") + ".")
        out += self._window_verdict(task, kept)
        return out

    def _window_verdict(self, task: Task, kept) -> list[str]:
        """Whether the window closes the gap between the all-primal conversion and the original, and how much
        of each head the trained gates give the window."""
        m = task.metric

        def final(key: str) -> list[float]:
            return [r["final"]["test"][m] for r in self._stored(task, f"{key}_transfer_finetune")
                    if r.get("final") and r["final"].get("test")]

        windows = [key for key, arm in task.arms.items() if "window" in arm.primal]
        control = {arm.primal["window"]: key for key, arm in task.arms.items()
                   if arm.primal.get("gate_init") == WINDOW_ONLY_GATE}
        primal = final("all")
        out = []
        for key in windows:
            got = final(key)
            if not got or not primal:
                continue
            gap = 100 - kept(primal)
            closed = (kept(got) - kept(primal)) / gap if gap > 0 else float("nan")
            alphas = [a for r in self._stored(task, f"{key}_transfer_finetune") for layer in r.get("window_alpha", [])
                      for a in layer]
            share = (f"; the trained gates give the window α = {statistics.mean(alphas):.2f} of each head on average "
                     f"(min {min(alphas):.2f}, max {max(alphas):.2f})") if alphas else ""
            verdict = ("closes the gap" if kept(got) >= 98 and closed > 0.5 else
                       "narrows the gap" if closed > 0 else "does not narrow the gap")
            alone = final(control[task.arms[key].primal["window"]]) if task.arms[key].primal["window"] in control \
                and key not in control.values() else []
            versus = ""
            if alone:  # the rule of "beats scratch": a mean difference beyond the larger seed spread
                spread = max(statistics.stdev(v) if len(v) > 1 else 0.0 for v in (got, alone))
                diff = statistics.mean(got) - statistics.mean(alone)
                better = -diff > spread if not task.higher_is_better else diff > spread
                worse = diff > spread if not task.higher_is_better else -diff > spread
                effect = ("cannot be judged yet (fewer than two seeds a side)" if min(len(got), len(alone)) < 2 else
                          "helps beyond the seed spread" if better else "hurts beyond the seed spread" if worse else
                          "changes nothing beyond the seed spread")
                versus = f" The window alone (the control) keeps {kept(alone):.1f} %: the primal term beside the window {effect}."
            if key in control.values():
                out.append(f"- **{task.arms[key].label}**: (iii) keeps {kept(got):.1f} % (all layers primal: "
                           f"{kept(primal):.1f} %).")
                continue
            out.append(f"- **{task.arms[key].label}** {verdict} to the original: (iii) keeps {kept(got):.1f} % against "
                       f"{kept(primal):.1f} % for all layers primal ({100 * closed:.0f} % of the gap closed){share}.{versus}")
        return [""] + out if out else []

    def _errors(self, task: Task) -> list[str]:
        rows = []
        for layers in task.arms:
            for r in self._stored(task, f"{layers}_transfer_finetune"):
                if "transfer" in r and "layer_error" in r["transfer"]:
                    before = r["swap"]["layer_error"]["in_model"]
                    after = r["transfer"]["layer_error"]["in_model"]
                    rows.append(f"| {layers} | {r['settings']['seed']} | "
                                + ", ".join(f"{k}: {before[k]:.3f} → {after[k]:.3f}" for k in before) + " |")
        if not rows:
            return []
        return ["Relative output error ‖y_primal − y_softmax‖² / ‖y_softmax‖² of each converted layer inside the",
                "converted model, on held-out examples, before → after attention transfer:", "",
                "| layers | seed | layer: swap → transfer |", "|---|---|---|", *rows, ""]

    def _decode_section(self) -> list[str]:
        own = self.results / "convert" / "decode.json"
        path = own if own.is_file() else ROOT / "docs" / "results" / "lm" / "decode.json"
        lines = ["## Decoding cost of the converted LMs", "",
                 "A conversion keeps the architecture of the scratch models (4 layers, D 128, H 4, s 30), so its decode",
                 "cost is theirs: the original decodes with a KV cache, the last-layer conversion with three KV caches",
                 "and one O(1) primal state, the all-layer conversion with O(1) state only, the window conversions with",
                 "the primal state and a ring of the last w keys and values per layer. Measured by `primal bench",
                 "--level decode` (batch 1, fp32, one CPU thread, random weights of the same shapes; the trained",
                 "models have learned positions up to 128 tokens, so they cannot be decoded at these contexts",
                 f"themselves). Source: `{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}`.", ""]
        if not path.is_file():
            return lines + ["*(not measured yet: run with `--decode`)*", ""]
        rows = [r for r in json.loads(path.read_text())["rows"] if r["context"] >= 4096]
        names = {"transformer": "original (softmax)", "primal+": "last layer converted", "primalformer": "all layers converted",
                 "window32-primalformer": "all layers window 32 + primal", "window128-primalformer": "all layers window 128 + primal"}
        names = {k: v for k, v in names.items() if any(r["model"] == k for r in rows)}
        contexts = sorted({r["context"] for r in rows})
        lines += ["| model | quantity | " + " | ".join(f"{c // 1024}K" for c in contexts) + " |",
                  "|---|---|" + "---|" * len(contexts)]
        for key, label in names.items():
            for what, field_, fmt, scale in (("tokens/s", "tokens_per_s", "{:.0f}", 1), ("cache KiB (state + decoding constants)", "state_mib", "{:.1f}", 1024),
                                             ("RSS growth MiB", "rss_growth_mib", "{:.0f}", 1)):
                cells = []
                for c in contexts:
                    r = next((r for r in rows if r["model"] == key and r["context"] == c), None)
                    cells.append("–" if r is None or r.get(field_) is None else fmt.format(r[field_] * scale))
                lines.append(f"| {label} | {what} | " + " | ".join(cells) + " |")
        return lines + [""]

    def measure_decode(self) -> None:
        from primal_attention.bench.decode import DecodeConfig, run_decode, write_outputs

        from primal_attention.bench.decode import DECODE_MODELS, WINDOW_MODELS

        result = run_decode(DecodeConfig(models=DECODE_MODELS + tuple(WINDOW_MODELS), contexts=tuple(self.args.decode_contexts)))
        write_outputs(result, self.results / "convert")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="lm4x,lm,uea", type=lambda s: [t for t in s.split(",") if t])
    p.add_argument("--seeds", default=None, type=lambda s: [int(x) for x in s.split(",")],
                   help="seeds to run (default: each task's own: 1, 2, 3 for lm4x, else 0, 1, 2)")
    p.add_argument("--transfer-steps", type=int, default=300, help="LM attention-transfer steps T")
    p.add_argument("--finetune-steps", type=int, default=300, help="LM fine-tuning steps F")
    p.add_argument("--eval-every", type=int, default=100, help="LM fine-tuning steps between validations")
    p.add_argument("--uea-epochs", type=int, default=20, help="epochs of the JapaneseVowels original")
    p.add_argument("--uea-transfer-steps", type=int, default=200)
    p.add_argument("--uea-finetune-steps", type=int, default=100)
    p.add_argument("--uea-eval-every", type=int, default=20)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override of every LM training config (e.g. tiny data for a dry run)")
    p.add_argument("--uea-set", action="append", default=[], metavar="KEY=VALUE", help="override of every UEA config")
    p.add_argument("--results", default=str(ROOT / "docs" / "results"), help="where convert_runs/ and convert.md go")
    p.add_argument("--work", default=str(ROOT / "runs" / "results_convert"), help="run folders and checkpoints")
    p.add_argument("--table-only", action="store_true")
    p.add_argument("--no-scratch", action="store_true", help="run the originals and conversions only, not the "
                   "(longer) from-scratch cells")
    p.add_argument("--decode", action="store_true", help="measure decoding at --decode-contexts (default 4K and 16K) of every model, the window ones included, into <results>/convert/decode.json")
    p.add_argument("--decode-contexts", default="4096,16384",
                   type=lambda s: [int(x) for x in s.split(",")])
    args = p.parse_args(argv)
    study = Study(args)
    unknown = [t for t in args.tasks if t not in study.tasks]
    if unknown:
        p.error(f"unknown task {unknown[0]!r}; expected some of {', '.join(study.tasks)}")
    if args.decode:
        study.measure_decode()
    if not args.table_only:
        study.run()
    study.write_page()


if __name__ == "__main__":
    main()
